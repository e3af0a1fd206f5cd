// Every ggml block type's file (ggml_<type>.hpp), for the code that dispatches over them all
// (MOEKIT_GGML_FORMATS in table.hpp lists them).
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
