// Every ggml block type (GGUF's quantized tensors moekit computes on): its file and its line in
// the list. A type is one file, ggml_<type>.hpp — its block, bytes, GGUF number, decode, integer
// form and int8 facts — an include and a list entry here, and an Element enumerator
// (moekit/weight_format.hpp); the format table, the GGUF reader and loader, the exact and int8
// kernels and the benchmarks take it from these.
#pragma once

#include "kernels/formats/ggml_iq4_nl.hpp"
#include "kernels/formats/ggml_iq4_xs.hpp"
#include "kernels/formats/ggml_mxfp4.hpp"
#include "kernels/formats/ggml_q2_k.hpp"
#include "kernels/formats/ggml_q3_k.hpp"
#include "kernels/formats/ggml_q4_0.hpp"
#include "kernels/formats/ggml_q4_1.hpp"
#include "kernels/formats/ggml_q4_k.hpp"
#include "kernels/formats/ggml_q5_0.hpp"
#include "kernels/formats/ggml_q5_1.hpp"
#include "kernels/formats/ggml_q5_k.hpp"
#include "kernels/formats/ggml_q6_k.hpp"
#include "kernels/formats/ggml_q8_0.hpp"

// X(element): one entry per type; `element` names its Element enumerator and its namespace.
#define MOEKIT_GGML_FORMATS(X) \
  X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q2_k) X(q3_k) X(q4_k) X(q5_k) X(q6_k) X(iq4_nl) X(iq4_xs) X(ggml_mxfp4)
