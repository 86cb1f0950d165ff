/* Compiled as C99 by the build: the public header must stand alone in C. */
#include "dspark.h"

int dspark_header_check(void) {
    struct dspark_model_params p = dspark_model_default_params();
    return p.device;
}
