/* foo: includes bar through its internal header */
#include "foo.h"
#include "foo_internal.h"
