// The command lines of cunvme_bench and file_peers (bench/*_options.hpp, on CLI11): good options
// parse to the values they say, and every bad one is refused with a message that names the
// option, before anything opens a device.
#include "cunvme_bench_options.hpp"
#include "file_peers_options.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bench = cunvme::bench;
namespace cb = bench::cunvme_bench;
namespace fp = bench::file_peers;

namespace {

/// argv for `arguments`, with the program's name first as a shell passes it; it points into
/// `arguments`, which must outlive it.
std::vector<const char*> argv_of(const char* program, const std::vector<std::string>& arguments) {
  std::vector<const char*> argv{program};
  for (const std::string& a : arguments) argv.push_back(a.c_str());
  return argv;
}

cb::options bench_options(const std::vector<std::string>& arguments) {
  const auto argv = argv_of("cunvme_bench", arguments);
  return cb::parse(static_cast<int>(argv.size()), argv.data());
}

fp::options peers_options(const std::vector<std::string>& arguments) {
  const auto argv = argv_of("file_peers", arguments);
  return fp::parse(static_cast<int>(argv.size()), argv.data());
}

/// The message CLI11 refuses `arguments` with ("" when they parse).
template <class Parse>
std::string refusal(Parse parse, const std::vector<std::string>& arguments) {
  try {
    (void)parse(arguments);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

std::string bench_refusal(const std::vector<std::string>& arguments) { return refusal(bench_options, arguments); }
std::string peers_refusal(const std::vector<std::string>& arguments) { return refusal(peers_options, arguments); }

}  // namespace

// ---- sizes -------------------------------------------------------------------------------------

TEST_CASE("a size reads with or without a unit, in either case, as powers of 1024") {
  CHECK(bench::bytes_of("4096") == 4096u);
  CHECK(bench::bytes_of("4k") == 4096u);
  CHECK(bench::bytes_of("4K") == 4096u);
  CHECK(bench::bytes_of("128M") == 128u << 20);
  CHECK(bench::bytes_of("8g") == std::uint64_t{8} << 30);
  CHECK(bench::bytes_of("2T") == std::uint64_t{2} << 40);
  CHECK(bench::bytes_of("0") == 0u);
}

TEST_CASE("a size with a fraction reads exactly when it is a whole number of bytes") {
  CHECK(bench::bytes_of("1.5G") == std::uint64_t{3} << 29);
  CHECK(bench::bytes_of("0.5k") == 512u);
  CHECK_FALSE(bench::bytes_of("1.5"));   // a byte and a half
  CHECK_FALSE(bench::bytes_of("0.3K"));  // 307.2 bytes
}

TEST_CASE("a size that is not a number with a known unit, or past 64 bits, is not a size") {
  for (const char* text : {"", "K", "4KB", "4 K", "-4K", "+4K", "4P", "0x10", "1e3", "1.", ".5K", "4.0000001K", "16777216T", "18446744073709551616"}) {
    CAPTURE(text);
    CHECK_FALSE(bench::bytes_of(text));
  }
  CHECK(bench::bytes_of("18446744073709551615") == ~std::uint64_t{0});
}

// ---- cunvme_bench: good command lines ------------------------------------------------------------

TEST_CASE("cunvme_bench with no options runs 2 s of 4 KiB random reads on the emulator") {
  const cb::options o = bench_options({});
  CHECK(o.rw == "randread");
  CHECK(o.bs == 4096);
  CHECK(o.qd == 1);
  CHECK(o.threads == 1024);
  CHECK(o.device == "emu");
  CHECK(o.size == 0);
  CHECK(o.time == cb::default_seconds);
  CHECK_FALSE(o.verify);
  CHECK_FALSE(o.json);
  CHECK_FALSE(o.probe);
}

TEST_CASE("cunvme_bench reads every option to the value it names") {
  const cb::options o = bench_options({"--rw", "read", "--bs", "128K", "--qd", "32", "--threads", "12", "--block-threads", "256", "--queues", "12",
                                       "--entries", "64", "--slots", "exclusive", "--completion", "dedicated_poller", "--doorbell", "mmio",
                                       "--tier", "3", "--size", "1.5G", "--device", "emu:pattern,workers=12", "--devices", "4",
                                       "--null-blocks", "16", "--buffer", "8G", "--seed", "18446744073709551615", "--verify", "--json", "--probe"});
  CHECK(o.rw == "read");
  CHECK(o.bs == 128u << 10);
  CHECK(o.qd == 32);
  CHECK(o.threads == 12);
  CHECK(o.block_threads == 256);
  CHECK(o.queues == 12);
  CHECK(o.entries == 64);
  CHECK(o.slots == "exclusive");
  CHECK(o.completion == "dedicated_poller");
  CHECK(o.doorbell == "mmio");
  CHECK(o.tier == 3);
  CHECK(o.size == std::uint64_t{3} << 29);
  CHECK(o.time == 0);
  CHECK(o.device == "emu:pattern,workers=12");
  CHECK(o.devices == 4);
  CHECK(o.null_blocks == 16);
  CHECK(o.buffer == std::uint64_t{8} << 30);
  CHECK(o.seed == ~std::uint64_t{0});
  CHECK(o.verify);
  CHECK(o.json);
  CHECK(o.probe);
}

TEST_CASE("cunvme_bench takes the last value of an option given twice") {
  CHECK(bench_options({"--threads", "64", "--threads", "12"}).threads == 12);
}

TEST_CASE("cunvme_bench reads --time as seconds, fractions included") {
  CHECK(bench_options({"--time", "0.5"}).time == 0.5);
  CHECK(bench_options({"--time", "1.5"}).size == 0);
}

TEST_CASE("cunvme_bench reads a whole number with leading zeros as decimal, not octal") {
  CHECK(bench_options({"--qd", "010"}).qd == 10);
}

TEST_CASE("cunvme_bench --baseline skips the I/O run's combination checks") {
  const cb::options o = bench_options({"--baseline", "h2d", "--size", "8G", "--queues", "1", "--devices", "4"});
  CHECK(o.baseline == "h2d");
  CHECK(o.size == std::uint64_t{8} << 30);
}

TEST_CASE("cunvme_bench --verify is accepted where the data is the pattern it checks") {
  CHECK(bench_options({"--device", "emu:pattern", "--verify"}).verify);
  CHECK(bench_options({"--device", "emu:workers=8,pattern=1", "--verify"}).verify);
  CHECK(bench_options({"--device", "gpu-null:copy", "--verify"}).verify);
  CHECK(bench_options({"--device", "sysfs:0000:01:00.0", "--verify"}).verify);  // a drive: the QEMU test disks hold the pattern
}

TEST_CASE("cunvme_bench splits --buffer over the devices, emulators and null controllers alike") {
  CHECK(bench_options({"--devices", "4", "--queues", "4", "--buffer", "1G"}).buffer_per_device() == 256u << 20);
  CHECK(bench_options({"--device", "gpu-null", "--devices", "4", "--queues", "4", "--buffer", "1G"}).buffer_per_device() == 256u << 20);
  CHECK(bench_options({"--device", "gpu-null", "--buffer", "1G"}).buffer_per_device() == 1u << 30);
}

TEST_CASE("cunvme_bench makes the devices one volume with --volume, a 64 KiB stripe unless --stripe says") {
  const cb::options striped = bench_options({"--device", "gpu-null:copy", "--devices", "4", "--queues", "8", "--volume", "striped", "--verify"});
  CHECK(striped.on_volume());
  CHECK(striped.volume == "striped");
  CHECK(striped.stripe == 64u * 1024);
  CHECK(bench_options({"--devices", "2", "--queues", "2", "--volume", "striped", "--stripe", "1M"}).stripe == 1u << 20);
  CHECK(bench_options({"--devices", "2", "--queues", "4", "--volume", "mirrored"}).volume == "mirrored");
  CHECK_FALSE(bench_options({}).on_volume());
}

// ---- cunvme_bench: refusals, each naming the option -------------------------------------------------

TEST_CASE("cunvme_bench refuses an unknown option") { CHECK(bench_refusal({"--queue-depth", "4"}).find("--queue-depth") != std::string::npos); }

TEST_CASE("cunvme_bench refuses an option without its value") { CHECK(bench_refusal({"--qd"}).find("--qd") != std::string::npos); }

TEST_CASE("cunvme_bench refuses a size with a unit it does not know") {
  const std::string why = bench_refusal({"--bs", "4KB"});
  CHECK(why.find("--bs") != std::string::npos);
  CHECK(why.find("4KB") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a size of 0 bytes") { CHECK(bench_refusal({"--size", "0"}).find("--size") != std::string::npos); }

TEST_CASE("cunvme_bench refuses a queue depth of 0") { CHECK(bench_refusal({"--qd", "0"}).find("--qd") != std::string::npos); }

TEST_CASE("cunvme_bench refuses a queue depth past the kernel's handles") {
  CHECK(bench_refusal({"--qd", std::to_string(cb::max_qd + 1)}).find("--qd") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a count that is not a plain decimal number") {
  for (const char* text : {"-1", "0x10", "4.0", "four", "", " 4", "4294967296"}) {
    CAPTURE(text);
    CHECK(bench_refusal({"--threads", text}).find("--threads") != std::string::npos);
  }
}

TEST_CASE("cunvme_bench refuses a seed past 64 bits or with a sign") {
  CHECK(bench_refusal({"--seed", "18446744073709551616"}).find("--seed") != std::string::npos);
  CHECK(bench_refusal({"--seed", "-1"}).find("--seed") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses block threads that are not whole warps up to 256") {
  for (const char* text : {"0", "16", "48", "288"}) {
    CAPTURE(text);
    CHECK(bench_refusal({"--block-threads", text}).find("--block-threads") != std::string::npos);
  }
}

TEST_CASE("cunvme_bench refuses a tier other than 1, 2 or 3") {
  CHECK(bench_refusal({"--tier", "0"}).find("--tier") != std::string::npos);
  CHECK(bench_refusal({"--tier", "4"}).find("--tier") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses queue entries outside NVMe's 2..65536") {
  CHECK(bench_refusal({"--entries", "1"}).find("--entries") != std::string::npos);
  CHECK(bench_refusal({"--entries", "65537"}).find("--entries") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses an access pattern, policy or baseline it does not know") {
  CHECK(bench_refusal({"--rw", "randrw"}).find("--rw") != std::string::npos);
  CHECK(bench_refusal({"--slots", "shared"}).find("--slots") != std::string::npos);
  CHECK(bench_refusal({"--completion", "interrupt"}).find("--completion") != std::string::npos);
  CHECK(bench_refusal({"--doorbell", "shadow"}).find("--doorbell") != std::string::npos);
  CHECK(bench_refusal({"--baseline", "d2h"}).find("--baseline") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a time that is not a positive number of seconds") {
  for (const char* text : {"0", "-1", "abc", "2s", "nan", "inf", "1e9"}) {
    CAPTURE(text);
    CHECK(bench_refusal({"--time", text}).find("--time") != std::string::npos);
  }
}

TEST_CASE("cunvme_bench refuses --size with --time") {
  const std::string why = bench_refusal({"--size", "16M", "--time", "2"});
  CHECK(why.find("--size") != std::string::npos);
  CHECK(why.find("--time") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses fewer queues than devices") {
  const std::string why = bench_refusal({"--devices", "4", "--queues", "2"});
  CHECK(why.find("--queues") != std::string::npos);
  CHECK(why.find("--devices") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses exclusive slots with more threads than queues") {
  const std::string why = bench_refusal({"--slots", "exclusive", "--threads", "64", "--queues", "32"});
  CHECK(why.find("--slots exclusive") != std::string::npos);
  CHECK(why.find("--threads") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a buffer share smaller than one command") {
  const std::string why = bench_refusal({"--buffer", "1M", "--devices", "4", "--queues", "4", "--bs", "512K"});
  CHECK(why.find("--buffer") != std::string::npos);
  CHECK(why.find("--bs") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses --verify without a buffer slot per command in flight") {
  const std::string why = bench_refusal({"--device", "emu:pattern", "--verify", "--threads", "1024", "--qd", "2", "--bs", "1M", "--buffer", "1G"});
  CHECK(why.find("--verify") != std::string::npos);
  CHECK(why.find("--buffer") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses --verify of writes") {
  CHECK(bench_refusal({"--device", "emu:pattern", "--verify", "--rw", "randwrite"}).find("--verify") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses --verify where no data moves") {
  CHECK(bench_refusal({"--device", "gpu-null", "--verify"}).find("gpu-null:copy") != std::string::npos);
  CHECK(bench_refusal({"--device", "emu:pattern,nodata", "--verify"}).find("nodata") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses --verify on an emulator not filled with the pattern") {
  const std::string why = bench_refusal({"--device", "emu:workers=8", "--verify"});
  CHECK(why.find("--verify") != std::string::npos);
  CHECK(why.find("pattern") != std::string::npos);
  CHECK(bench_refusal({"--device", "emu:pattern=0", "--verify"}).find("pattern") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses --verify on an emulator URI the emulator would refuse") {
  CHECK(bench_refusal({"--device", "emu:pattern=maybe", "--verify"}).find("pattern=maybe") != std::string::npos);
}

TEST_CASE("cunvme_bench --help is a request, not a refusal") {
  const std::vector<std::string> arguments{"--help"};  // argv points into it
  const auto argv = argv_of("cunvme_bench", arguments);
  CHECK_THROWS_AS((void)cb::parse(static_cast<int>(argv.size()), argv.data()), CLI::CallForHelp);
}

// ---- file_peers --------------------------------------------------------------------------------------

TEST_CASE("file_peers with only --file runs every method with the defaults") {
  const fp::options o = peers_options({"--file", "/data/big.bin"});
  CHECK(o.file == "/data/big.bin");
  CHECK_FALSE(o.create_size);
  CHECK(o.methods == fp::all_methods);
  CHECK(o.threads == 4);
  CHECK(o.chunk == 8u << 20);
  CHECK(o.workers == 8);
  CHECK(o.repeat == 1);
  CHECK_FALSE(o.json);
  CHECK_FALSE(o.cufile_buffered);
  CHECK(o.cufile_trace.empty());
}

TEST_CASE("file_peers reads every option to the value it names") {
  const fp::options o = peers_options({"--file", "f.bin", "--create-size", "4G", "--methods", "pread,cunvme", "--threads", "256", "--chunk", "16M",
                                       "--workers", "64", "--repeat", "5", "--json", "--cufile-trace", "/tmp/trace", "--cufile-buffered"});
  CHECK(o.file == "f.bin");
  REQUIRE(o.create_size);
  CHECK(*o.create_size == std::uint64_t{4} << 30);
  CHECK(o.methods == std::vector<std::string>{"pread", "cunvme"});
  CHECK(o.threads == 256);
  CHECK(o.chunk == 16u << 20);
  CHECK(o.workers == 64);
  CHECK(o.repeat == 5);
  CHECK(o.json);
  CHECK(o.cufile_trace == "/tmp/trace");
  CHECK(o.cufile_buffered);
}

TEST_CASE("file_peers runs the methods of both lists when --methods is given twice") {
  CHECK(peers_options({"--file", "f", "--methods", "mmap", "--methods", "pread,cunvme"}).methods == std::vector<std::string>{"mmap", "pread", "cunvme"});
}

TEST_CASE("file_peers refuses a command line without --file") { CHECK(peers_refusal({"--json"}).find("--file") != std::string::npos); }

TEST_CASE("file_peers refuses an unknown option") { CHECK(peers_refusal({"--file", "f", "--method", "pread"}).find("--method") != std::string::npos); }

TEST_CASE("file_peers refuses an option without its value") { CHECK(peers_refusal({"--file", "f", "--repeat"}).find("--repeat") != std::string::npos); }

TEST_CASE("file_peers refuses a method it does not know") {
  const std::string why = peers_refusal({"--file", "x", "--methods", "pread,scp"});
  CHECK(why.find("--methods") != std::string::npos);
  CHECK(why.find("scp") != std::string::npos);
}

TEST_CASE("file_peers refuses a created file that is not whole 4 KiB pages") {
  CHECK(peers_refusal({"--file", "f", "--create-size", "1000"}).find("--create-size") != std::string::npos);
  CHECK(peers_refusal({"--file", "f", "--create-size", "0"}).find("--create-size") != std::string::npos);
}

TEST_CASE("file_peers refuses a size with a unit it does not know") {
  CHECK(peers_refusal({"--file", "f", "--chunk", "8MB"}).find("--chunk") != std::string::npos);
}

TEST_CASE("file_peers refuses counts out of their ranges") {
  CHECK(peers_refusal({"--file", "f", "--threads", "0"}).find("--threads") != std::string::npos);
  CHECK(peers_refusal({"--file", "f", "--threads", "257"}).find("--threads") != std::string::npos);
  CHECK(peers_refusal({"--file", "f", "--workers", "65"}).find("--workers") != std::string::npos);
  CHECK(peers_refusal({"--file", "f", "--repeat", "1001"}).find("--repeat") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a volume layout it does not know") {
  CHECK(bench_refusal({"--volume", "raid5"}).find("--volume") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a stripe that is not a power of two, or not whole commands") {
  CHECK(bench_refusal({"--volume", "striped", "--stripe", "96K"}).find("--stripe") != std::string::npos);
  const std::string why = bench_refusal({"--volume", "striped", "--stripe", "4K", "--bs", "8K"});
  CHECK(why.find("--stripe") != std::string::npos);
  CHECK(why.find("--bs") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a volume whose members would have different numbers of queue pairs") {
  const std::string why = bench_refusal({"--devices", "4", "--queues", "6", "--volume", "striped"});
  CHECK(why.find("--volume") != std::string::npos);
  CHECK(why.find("--queues") != std::string::npos);
}

TEST_CASE("cunvme_bench refuses a volume with exclusive slots, and writes on a mirrored volume") {
  CHECK(bench_refusal({"--devices", "2", "--queues", "2", "--volume", "striped", "--slots", "exclusive", "--threads", "2"}).find("--volume") != std::string::npos);
  CHECK(bench_refusal({"--devices", "2", "--queues", "2", "--volume", "mirrored", "--rw", "randwrite"}).find("--volume mirrored") != std::string::npos);
}

TEST_CASE("cunvme_bench reads a null controller's keys: copy, and a timing preset that makes it a modelled drive") {
  CHECK_FALSE(bench::cunvme_bench::null_device_of("gpu-null").copy);
  CHECK_FALSE(bench::cunvme_bench::null_device_of("gpu-null").timing.enabled());
  CHECK(bench::cunvme_bench::null_device_of("gpu-null:copy").copy);
  const auto drive = bench::cunvme_bench::null_device_of("gpu-null:copy,timing=datacenter-gen4");
  CHECK(drive.copy);
  CHECK(drive.timing == cunvme::emu::timing_model::datacenter_gen4());
  CHECK(bench_options({"--device", "gpu-null:copy,timing=datacenter-gen4", "--verify"}).verify);
}

TEST_CASE("cunvme_bench refuses a null controller key or timing preset it does not know, and --verify without copy") {
  CHECK(bench_refusal({"--device", "gpu-null:fast"}).find("--device") != std::string::npos);
  CHECK(bench_refusal({"--device", "gpu-null:timing=gen9"}).find("gen9") != std::string::npos);
  CHECK(bench_refusal({"--device", "gpu-null:timing=scm", "--verify"}).find("--verify") != std::string::npos);
}
