// The plain-C device engine tests, compiled again as C++17.
#include "device_engine_test.c"
