#include <iostream>

#include <mooncake_weight_store.hpp>

int main() {
    try {
        mws::Placement::from_json("{}");
    } catch (const mws::Error &e) {
        std::cout << "mooncake_weight_store " << mws::version() << ": " << e.what() << "\n";
        return e.status() == MWS_INVALID_ARGUMENT ? 0 : 1;
    }
    return 1;
}
