// The generated C header and the C++ wrapper compile as C++17 with
// -Wall -Wextra -Wpedantic -Werror.
#include "mooncake_weight_store.h"
#include "mooncake_weight_store.hpp"

int mws_header_check_cxx();
int mws_header_check_cxx() {
    mws_runtime_fragment f{};
    (void)f;
    return static_cast<int>(MWS_OK);
}
