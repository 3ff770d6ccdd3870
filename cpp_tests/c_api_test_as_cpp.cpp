// The plain-C tests, compiled again as C++17 (the header must work for both).
#include "c_api_test.c"
