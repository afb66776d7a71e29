/* bar calls back into foo: the circle */
#include "bar.h"
#include "foo.h"
#include <stdio.h>
