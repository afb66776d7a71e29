/* include/ is its parent: qux.h and qux.c are one module */
#include "qux.h"
#include "bar.h"
