/* a foo_*.h is module foo */
#include "bar.h"
