#include <stdio.h>
#include <string.h>

#include <mooncake_weight_store.h>

int main(void) {
    mws_placement *p = NULL;
    mws_status st = mws_placement_from_json("{}", 2, &p);
    printf("mooncake_weight_store %s: parsing {} gives %s\n", mws_version(), mws_status_name(st));
    return st == MWS_INVALID_ARGUMENT && p == NULL && strlen(mws_last_error_message()) > 0 ? 0 : 1;
}
