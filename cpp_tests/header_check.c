/* The generated header compiles as C11 with -Wall -Wextra -Wpedantic -Werror. */
#include "mooncake_weight_store.h"

int mws_header_check_c(void);
int mws_header_check_c(void) {
    mws_runtime_fragment f = {0};
    mws_status s = MWS_OK;
    (void)f;
    return (int)s + MWS_VERSION_MAJOR * 0;
}
