// The umbrella header: everything public in moekit.
#pragma once

#include "moekit/config.hpp"
#include "moekit/experts.hpp"
#include "moekit/layer.hpp"
#include "moekit/routing.hpp"
#include "moekit/tensor.hpp"
#include "moekit/threading.hpp"
