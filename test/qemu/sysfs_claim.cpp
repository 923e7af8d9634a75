// One owner per sysfs: controller, inside the QEMU guest: while a first handle writes and reads
// the controller, a second open — from another process and from this one — is refused with an
// error naming the device and the holder, and the first handle's data comes back intact (a
// second opener that got through would reset the controller under it).
//
//   sysfs_claim BDF
//
// Needs root and the controller unbound. Prints "PASS name" / "FAIL name: why" per case and a
// summary; exits 0 when all passed.
#include <cunvme/host/open.cuh>

#include "../guest_checks.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace {

using test::expect;
using test::failure;

constexpr std::uint64_t lba = 4096, blocks = 64;

/// What a refused second open must say: the device, that it is in use, and who holds it.
void expect_refusal(const std::string& what, const std::string& bdf, pid_t holder) {
  expect(what.find(bdf) != std::string::npos, "the error does not name " + bdf + ": " + what);
  expect(what.find("in use by another owner") != std::string::npos, "the error does not say the device is in use: " + what);
  expect(what.find("process " + std::to_string(holder)) != std::string::npos, "the error does not name the holder: " + what);
}

void fill(host::dma_buffer& b, std::uint8_t seed) {
  for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = std::byte(static_cast<std::uint8_t>(seed + i * 7));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !host::valid_bdf(argv[1])) {
    std::fprintf(stderr, "usage: %s BDF (unbound)\n", argv[0]);
    return 2;
  }
  const std::string bdf = argv[1];
  const std::string uri = "sysfs:" + bdf;
  test::tally results;
  results.run("a second open of a sysfs controller in use is refused, and the first's data is intact", [&] {
    auto first = host::open(uri);
    auto qp = first->create_queue_pair(16);
    auto out = first->memory().allocate(blocks * 512);
    fill(out, 0x3c);
    expect(qp->write(1, lba, blocks, out) == spec::status::successful_completion, "the first handle's write failed");

    // Another process: it must be refused before it touches the controller.
    int pipefd[2];
    expect(::pipe(pipefd) == 0, "pipe");
    const pid_t child = ::fork();
    if (child == 0) {
      std::string what = "opened";
      try {
        auto second = host::open(uri);
      } catch (const std::exception& e) {
        what = e.what();
      }
      (void)!::write(pipefd[1], what.data(), what.size());
      ::_exit(0);
    }
    ::close(pipefd[1]);
    std::string child_what;
    char chunk[512];
    for (ssize_t n; (n = ::read(pipefd[0], chunk, sizeof chunk)) > 0;) child_what.append(chunk, static_cast<std::size_t>(n));
    ::close(pipefd[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    expect(child_what != "opened", "a second process opened the controller while the first used it");
    expect_refusal(child_what, bdf, ::getpid());

    // This process again.
    std::string same_what = "opened";
    try {
      auto second = host::open(uri);
    } catch (const std::exception& e) {
      same_what = e.what();
    }
    expect(same_what != "opened", "a second handle in the same process opened the controller while the first used it");
    expect_refusal(same_what, bdf, ::getpid());

    // The first handle still works, and its data is what it wrote.
    expect(first->csts().rdy() && !first->csts().cfs(), "the first handle's controller is no longer ready");
    auto in = first->memory().allocate(blocks * 512);
    expect(qp->read(1, lba, blocks, in) == spec::status::successful_completion, "the first handle's read failed");
    expect(std::memcmp(in.data(), out.data(), out.size()) == 0, "the first handle's data changed");
  });
  results.run("the controller opens again once the first handle is closed", [&] {
    auto again = host::open(uri);
    auto qp = again->create_queue_pair(16);
    auto in = again->memory().allocate(blocks * 512);
    auto want = again->memory().allocate(blocks * 512);
    fill(want, 0x3c);
    expect(qp->read(1, lba, blocks, in) == spec::status::successful_completion, "the read after reopening failed");
    expect(std::memcmp(in.data(), want.data(), want.size()) == 0, "the data written before is not there after reopening");
  });
  return results.summary("sysfs_claim");
}
