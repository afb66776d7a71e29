/* qux.h */
#include "foo.h"
