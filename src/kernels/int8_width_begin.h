// The instruction set of the int8 kernels' -inl.h files included after it, until
// int8_width_end.h: the includer defines MOEKIT_I8_VNNI (0: AVX2, 1: AVX512-VNNI on 256-bit
// vectors), this sets from it
//   MOEKIT_I8_ATTR  the functions' target attribute
//   MOEKIT_I8_NAME  the name decoration of this instruction set's functions (f_avx2, f_vnni)
// The translation units of the int8 kernels (int8_rows.cpp, int8_panels.cpp,
// formats/ggml_decode.cpp) include their -inl.h files twice between these two, once per set.
// No include guard: included twice, on purpose.
#if MOEKIT_I8_VNNI
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define MOEKIT_I8_NAME(f) f##_vnni
#else
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c")))
#define MOEKIT_I8_NAME(f) f##_avx2
#endif
#pragma GCC diagnostic push
#if MOEKIT_I8_VNNI
// GCC 12's AVX-512 headers make their "undefined" source operands as `__m512 __Y = __Y;`, which
// -W(maybe-)uninitialized reports once _mm512_cvtepi32_ps and the other 512-bit intrinsics built
// on it are inlined: a false positive (every lane is written), silenced for these kernels alone.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif
