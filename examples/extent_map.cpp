// extent_map — a file by path on a raw SSD: take its map while the file system is mounted,
// read it by that map once the controller is cunvme's.
//
//   extent_map take FILE -o MAP [--device-block-bytes N] [--partition-offset BYTES]
//       while mounted: FIEMAP (synced) and SHA-256 of FILE into MAP (loader/extent_map.cuh)
//   extent_map check MAP FILE
//       while mounted: is FILE still the version MAP was taken of (inode, generation, size,
//       times)? The hash cannot tell a file deleted and written anew whose old blocks kept
//       the old bytes (loader/extent_map.cuh): check just before unmounting
//   extent_map read URI MAP -o OUT [--nsid N] [--file FILE]
//       after the controller was unbound from the kernel: read the file from namespace N
//       (default 1) by MAP, check its SHA-256, write it to OUT (OUT.partial until it matched);
//       with --file, first `check` FILE (where its file system is still mounted elsewhere,
//       e.g. a partition other than the one read)
//   extent_map verify URI MAP [--nsid N] [--file FILE]
//       the same without writing the file
//   extent_map show MAP
//       parse MAP strictly and print its summary
//
// The file must not change after the map is taken (see README, "Extent maps"). Exits 0 on
// success, 1 on any error (printed with what was being done and why), 2 for bad usage.
#include <cunvme/loader/extent_map.cuh>
#include <cunvme/host/open.cuh>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace host = cunvme::host;
namespace loader = cunvme::loader;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: extent_map take FILE -o MAP [--device-block-bytes N] [--partition-offset BYTES]\n"
               "       extent_map check MAP FILE\n"
               "       extent_map read URI MAP -o OUT [--nsid N] [--file FILE]\n"
               "       extent_map verify URI MAP [--nsid N] [--file FILE]\n"
               "       extent_map show MAP\n");
  return 2;
}

bool parse_number(std::string_view s, std::uint64_t& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc{} && end == s.data() + s.size();
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string_view command = argv[1];
  std::vector<std::string> positional;
  std::string output, file;
  std::uint64_t device_block = 0, nsid = 1;
  std::optional<std::uint64_t> partition_offset;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    std::uint64_t v = 0;
    if (a == "-o" && has_value) {
      output = argv[++i];
    } else if (a == "--file" && has_value) {
      file = argv[++i];
    } else if (a == "--device-block-bytes" && has_value && parse_number(argv[i + 1], v) && v <= (std::uint64_t{1} << 31)) {
      device_block = v;
      ++i;
    } else if (a == "--partition-offset" && has_value && parse_number(argv[i + 1], v)) {
      partition_offset = v;
      ++i;
    } else if (a == "--nsid" && has_value && parse_number(argv[i + 1], v) && v >= 1 && v <= 0xFFFFFFFEu) {
      nsid = v;
      ++i;
    } else if (a.starts_with("-")) {
      std::fprintf(stderr, "extent_map: bad option or value: %s\n", argv[i]);
      return usage();
    } else {
      positional.emplace_back(a);
    }
  }

  if (command != "read" && command != "verify" && !file.empty()) return usage();
  if (command == "check") {
    if (positional.size() != 2 || !output.empty()) return usage();
    const loader::extent_map map = loader::read_extent_map_file(positional[0]);
    loader::check_file_identity(map, positional[1]);
    std::printf("%s: the version %s was taken of (inode %llu, %llu bytes)\n", positional[1].c_str(), positional[0].c_str(),
                static_cast<unsigned long long>(map.identity->inode), static_cast<unsigned long long>(map.identity->size));
    return 0;
  }
  if (command == "take") {
    if (positional.size() != 1 || output.empty()) return usage();
    loader::take_options options;
    options.device_block_bytes = static_cast<std::uint32_t>(device_block);
    options.partition_offset_bytes = partition_offset;
    const loader::extent_map map = loader::take_extent_map(positional[0], options);
    loader::write_extent_map_file(output, map);
    std::printf("%s: %llu bytes in %zu extents of %u-byte blocks on %s (partition %s at byte %llu), sha256 %s\n", positional[0].c_str(),
                static_cast<unsigned long long>(map.file_size), map.extents.size(), map.device_block_bytes, map.device.c_str(), map.partition.c_str(),
                static_cast<unsigned long long>(map.partition_offset_bytes), map.sha256.c_str());
    return 0;
  }
  if (command == "show") {
    if (positional.size() != 1 || !output.empty()) return usage();
    const loader::extent_map map = loader::read_extent_map_file(positional[0]);
    std::printf("%llu bytes, %zu extents, fs blocks %u, device blocks %u, device %s, partition %s at byte %llu, sha256 %s\n",
                static_cast<unsigned long long>(map.file_size), map.extents.size(), map.fs_block_bytes, map.device_block_bytes, map.device.c_str(),
                map.partition.c_str(), static_cast<unsigned long long>(map.partition_offset_bytes), map.sha256.c_str());
    return 0;
  }
  if (command == "read" || command == "verify") {
    if (positional.size() != 2 || (command == "read") == output.empty()) return usage();
    const loader::extent_map map = loader::read_extent_map_file(positional[1]);
    // Before the device is opened: a replaced file's old blocks may still hash right.
    if (!file.empty()) loader::check_file_identity(map, file);
    auto ctrl = host::open(positional[0]);
    auto qp = ctrl->create_queue_pair(64);
    const std::string partial = output + ".partial";
    std::ofstream out;
    if (!output.empty()) {
      out.open(partial, std::ios::binary | std::ios::trunc);
      if (!out) throw host::os_error("Open output", partial);
    }
    try {
      loader::read_by_extent_map(*ctrl, *qp, static_cast<std::uint32_t>(nsid), map, [&](std::span<const std::byte> s) {
        if (out.is_open() && !out.write(reinterpret_cast<const char*>(s.data()), static_cast<std::streamsize>(s.size()))) {
          throw host::os_error("Write output", partial);
        }
      });
      if (out.is_open()) {
        out.close();
        if (!out || std::rename(partial.c_str(), output.c_str()) != 0) throw host::os_error("Write output", output);
      }
    } catch (...) {
      if (out.is_open()) out.close();
      if (!output.empty()) std::remove(partial.c_str());
      throw;
    }
    std::printf("%s: %llu bytes read by the map from namespace %llu of %s, sha256 %s matches\n", positional[1].c_str(),
                static_cast<unsigned long long>(map.file_size), static_cast<unsigned long long>(nsid), ctrl->name().c_str(), map.sha256.c_str());
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "extent_map: %s\n", e.what());
    return 1;
  }
}
