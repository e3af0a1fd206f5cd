// The instruction set of the int8 kernels' -inl.h files included after it, until
// int8_width_end.h: the includer defines MOEKIT_I8_VNNI (0: AVX2, 1: AVX512-VNNI on 256-bit
// vectors), this sets from it
//   MOEKIT_I8_ATTR  the functions' target attribute
// The translation units of the int8 kernels (int8_rows.cpp, int8_panels.cpp,
// formats/ggml_decode.cpp) include their -inl.h files twice between these two, once per set,
// each time inside a namespace named for the set (`avx2`, `vnni`), so a function keeps its plain
// name (`avx2::chunk_k`, `vnni::chunk_k`). A template over the set cannot replace the double
// include: GCC fixes a function's target attribute per definition, not per instantiation, and
// the intrinsics refuse to inline into a function without it.
// No include guard: included twice, on purpose.
#if MOEKIT_I8_VNNI
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#else
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c")))
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
