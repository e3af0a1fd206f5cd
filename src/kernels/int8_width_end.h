// Ends what int8_width_begin.h set. No include guard: included twice, on purpose.
#pragma GCC diagnostic pop
#undef MOEKIT_I8_ATTR
#undef MOEKIT_I8_VNNI
