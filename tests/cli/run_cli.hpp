// Runs the built `moekit` binary (MOEKIT_CLI_PATH) in a shell and captures its exit status,
// stdout and stderr. One helper for every CLI test file.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moekit::testing {

struct RunResult {
  bool exited = false;  // false: killed by a signal
  int exit_code = -1;
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

/// Runs `moekit args...`; stdout/stderr go through files in `scratch_dir` (removed afterwards).
/// `exec` replaces the shell so that a signal is seen as one.
inline RunResult run_cli(const std::vector<std::string>& args, const std::filesystem::path& scratch_dir) {
  // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on `"literal" + std::string&&`.
  std::string cmd = "exec ";
  cmd += shell_quote(MOEKIT_CLI_PATH);
  for (const std::string& a : args) {
    cmd += ' ';
    cmd += shell_quote(a);
  }
  const std::filesystem::path out = scratch_dir / "stdout.txt", err = scratch_dir / "stderr.txt";
  cmd += " > " + shell_quote(out.string()) + " 2> " + shell_quote(err.string());
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exited = status != -1 && WIFEXITED(status);
  r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace moekit::testing
