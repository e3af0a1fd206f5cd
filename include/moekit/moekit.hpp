// The umbrella header: everything public in moekit.
#pragma once

#include "moekit/checkpoint.hpp"
#include "moekit/config.hpp"
#include "moekit/corpus.hpp"
#include "moekit/experts.hpp"
#include "moekit/layer.hpp"
#include "moekit/lm.hpp"
#include "moekit/lm_train.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/quantize.hpp"
#include "moekit/routing.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/tensor.hpp"
#include "moekit/threading.hpp"
#include "moekit/tokenizer.hpp"
#include "moekit/train.hpp"
