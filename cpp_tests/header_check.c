/* The generated header compiles as C11 with -Wall -Wextra -Wpedantic -Werror. */
#include "mooncake_weight_store.h"

int mws_header_check_c(void);
int mws_header_check_c(void) {
    mws_runtime_fragment f = {0};
    mws_status s = MWS_OK;
    /* Every enum the callbacks and structs refer to is exported. */
    mws_terminal_state t = MWS_TERMINAL_COMPLETED;
    mws_memory_kind k = MWS_MEMORY_HOST;
    mws_decision d = MWS_DECISION_NONE;
    (void)f;
    return (int)s + (int)t * 0 + (int)k * 0 + (int)d * 0 + MWS_VERSION_MAJOR * 0;
}
