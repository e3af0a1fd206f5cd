#include "layer_io.hpp"

#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "moekit/model.hpp"
#include "moekit/npy.hpp"

namespace moekit::cli {

namespace fs = std::filesystem;

// "[3, 17]": the multi-index of flat element `flat` in `shape`.
std::string index_str(const Shape& shape, std::int64_t flat) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] > 0 ? flat % shape[i] : 0;
    flat = shape[i] > 0 ? flat / shape[i] : 0;
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < idx.size(); ++i) os << (i ? ", " : "") << idx[i];
  os << "]";
  return os.str();
}

// Reads X and returns it as f32 [..., D]; f16 is widened exactly. Rejects other dtypes, rank 0,
// a last dimension other than D and non-finite values (naming the first one).
Tensor read_activation(const std::string& prefix, const std::string& what, const std::string& path, std::int64_t D,
                       const std::string& model, std::int64_t layer) {
  Tensor x = read_npy(path);
  if (x.dtype() != DType::f32 && x.dtype() != DType::f16) {
    std::ostringstream os;
    os << prefix << what << " '" << path << "' has dtype " << dtype_name(x.dtype())
       << "; expected f32 ('<f4'; f16 '<f2' is converted to f32)";
    throw std::invalid_argument(os.str());
  }
  if (x.rank() < 1 || x.dim(-1) != D) {
    std::ostringstream os;
    os << prefix << what << " '" << path << "' has shape " << shape_str(x.shape())
       << " (D = " << (x.rank() < 1 ? std::string("none, rank 0") : std::to_string(x.dim(-1)))
       << ") but layer " << layer << " of '" << model << "' has hidden_size D = " << D
       << "; expected [..., " << D << "]";
    throw std::invalid_argument(os.str());
  }
  if (x.dtype() != DType::f32) x = to_dtype(x, DType::f32);
  const float* p = x.data_as<const float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(p[i])) {
      std::ostringstream os;
      os << prefix << what << " '" << path << "' has a non-finite value (" << p[i] << ") at "
         << index_str(x.shape(), i) << " (the first one)";
      throw std::invalid_argument(os.str());
    }
  }
  return x;
}

// An output path must name a file in an existing directory. Checked before any work so that a
// typo costs nothing; write_npy would also fail, later.
void check_output_path(const std::string& prefix, const std::string& path, const char* option) {
  const fs::path p(path);
  if (p.filename().empty())
    throw std::invalid_argument(prefix + option + " '" + path +
                                "' names a directory, not a file");
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error(prefix + option + " '" + path + "': directory '" +
                             dir.string() + "' does not exist");
  if (fs::is_directory(p, ec))
    throw std::invalid_argument(prefix + option + " '" + path + "' is a directory");
}

MoeLayer load_layer_with_knobs(const std::string& prefix, const std::string& model, std::int64_t layer,
                               const std::vector<std::string>& knobs) {
  MoeConfig config = load_config(model);
  for (const std::string& kv : knobs) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::invalid_argument(prefix + "--router expects KEY=VALUE, got '" + kv + "'");
    set_router_knob(config.router, kv.substr(0, eq), kv.substr(eq + 1));
  }
  validate(config.router);
  return load_moe_layer(model, config, layer);
}

}  // namespace moekit::cli
