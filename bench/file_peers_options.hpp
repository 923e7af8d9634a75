// file_peers' command line: its options and their ranges. Plain C++ (no CUDA): the bench suite
// (test/bench/options_test.cpp) runs it on any machine.
#pragma once

#include "command_line.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace bench::file_peers {

/// The ways of moving a file into GPU memory file_peers compares, in the order it runs them.
inline const std::vector<std::string> all_methods = {"cunvme", "cufile", "pread", "mmap", "pin"};

struct options {
  std::string file;
  std::optional<std::uint64_t> create_size;  ///< write a file of this size first (unless one is there)
  std::vector<std::string> methods = all_methods;
  unsigned threads = 4;                  ///< cuFile's and the pread pipeline's threads
  std::uint64_t chunk = 8u << 20;        ///< the pread pipeline's piece
  unsigned workers = 8;                  ///< the emulator's worker threads
  unsigned repeat = 1;
  bool json = false;
  bool cufile_buffered = false;
  std::string cufile_trace;  ///< a directory for cuFile's TRACE log; "" for none
};

/// file_peers' options on a CLI11 app, bound to `o`.
inline std::unique_ptr<CLI::App> make_app(options& o) {
  auto app = std::make_unique<CLI::App>(
      "A whole file into one GPU buffer, by cunvme (the emulator backed by the file), cuFile, a pread pipeline and mmap,\n"
      "each checksummed on the GPU against the file. Sizes take k, m, g or t (powers of 1024).",
      "file_peers");
  // An option given twice takes its last value, as the hand-written parser before CLI11 did;
  // --methods given twice runs the methods of both.
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--file", o.file, "the file to read (created first with --create-size)")->required();
  // A page multiple: O_DIRECT (cuFile) and the emulator's blocks read whole pages.
  app->add_option("--create-size", o.create_size, "write a file of this many bytes first, unless one of that size is there")
      ->transform(size_in_bytes(4096, 4096));
  app->add_option("--methods", o.methods, "the methods to run, separated by commas")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::IsMember(all_methods))
      ->capture_default_str();
  app->add_option("--threads", o.threads, "threads of cuFile and of the pread pipeline")->transform(whole_number(1, 256))->capture_default_str();
  app->add_option("--chunk", o.chunk, "bytes each pread reads")->transform(size_in_bytes())->capture_default_str();
  app->add_option("--workers", o.workers, "the emulator's worker threads (cunvme)")->transform(whole_number(1, 64))->capture_default_str();
  app->add_option("--repeat", o.repeat, "runs of each method (best and median reported)")->transform(whole_number(1, 1000))->capture_default_str();
  app->add_flag("--json", o.json, "print one JSON object instead of a table");
  app->add_option("--cufile-trace", o.cufile_trace, "write cuFile's TRACE log into this directory (and its cufile.json)");
  app->add_flag("--cufile-buffered", o.cufile_buffered, "open the file for cuFile without O_DIRECT (compat mode reads the page cache)");
  return app;
}

/// The options of a command line (argv[0] first), or the CLI::ParseError that refused it.
[[nodiscard]] inline options parse(int argc, const char* const* argv) {
  options o;
  make_app(o)->parse(argc, argv);
  return o;
}

}  // namespace bench::file_peers
CUNVME_NAMESPACE_END
