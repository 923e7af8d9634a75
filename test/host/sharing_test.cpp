// Several processes on one controller: an owner of the admin queue (sharing::controller_owner
// over `emu:shared`) and processes attached to it (`host::open("attach:PATH")`), each with
// queue pairs of its own. The processes are this test program run again (posix_spawn of
// /proc/self/exe, selecting the "(child process)" case), so each is a process of its own with
// its own memory, as under torch.distributed.
#include <cunvme/host/open.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>
#include <cunvme/spec/command_fields.cuh>

#include <doctest/doctest.h>

#include "../child_processes.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace cunvme;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t sharing_block = 512;
constexpr std::uint64_t sharing_blocks_per_thread = 256;  // each thread's own range
constexpr std::uint64_t sharing_blocks_per_command = 32;
constexpr unsigned sharing_threads = 2;                   // one queue pair each

/// What block `lba` holds after round `round` of process `index`.
std::uint64_t sharing_word(unsigned index, unsigned round, std::uint64_t lba, std::size_t word) {
  return (std::uint64_t{index} << 56) ^ (std::uint64_t{round} << 40) ^ (lba << 8) ^ word;
}

std::uint64_t sharing_first_lba(unsigned index, unsigned thread) {
  return (std::uint64_t{index} * sharing_threads + thread) * sharing_blocks_per_thread;
}

std::string sharing_env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string sharing_socket_path(const char* what) {
  static std::atomic<int> n{0};
  return "/tmp/cunvme-sharing-" + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(n++) + ".sock";
}

/// One run of this program as an attached process.
pid_t spawn_sharing_child(const std::string& socket, unsigned index, unsigned rounds, const std::string& progress) {
  const pid_t pid = test::spawn_self({"--test-case=(child process)*", "--no-skip", "--source-file=*sharing_test*", "--no-intro", "--no-version"},
                                     {"CUNVME_SHARING_SOCKET=" + socket, "CUNVME_SHARING_INDEX=" + std::to_string(index),
                                      "CUNVME_SHARING_ROUNDS=" + std::to_string(rounds), "CUNVME_SHARING_PROGRESS=" + progress});
  REQUIRE(pid > 0);
  return pid;
}

bool sharing_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

template <class Predicate>
bool sharing_eventually(Predicate p, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

/// The owner's side of every case: an emulator with a shared BAR0, served at a fresh path.
struct sharing_owner {
  explicit sharing_owner(const char* what, std::uint16_t queue_pairs = 64)
      : path(sharing_socket_path(what)),
        ctrl(host::open("emu:shared,blocks=65536", [&] {
          host::controller_options o;
          o.io_queue_pairs = queue_pairs;
          return o;
        }())),
        owner(*ctrl, path) {}
  std::string path;
  std::unique_ptr<host::controller> ctrl;
  host::sharing::controller_owner owner;
};

}  // namespace

TEST_CASE("(child process) attached to a shared controller, each thread writes and reads back its own blocks on its own queue pair" *
          doctest::skip()) {
  const std::string socket = sharing_env("CUNVME_SHARING_SOCKET");
  REQUIRE_MESSAGE(!socket.empty(), "run by the sharing tests only");
  const unsigned index = static_cast<unsigned>(std::stoul(sharing_env("CUNVME_SHARING_INDEX")));
  const unsigned rounds = static_cast<unsigned>(std::stoul(sharing_env("CUNVME_SHARING_ROUNDS")));
  const std::string progress = sharing_env("CUNVME_SHARING_PROGRESS");
  auto ctrl = host::open("attach:" + socket);
  REQUIRE(ctrl->attached());
  const std::uint32_t nsid = ctrl->namespaces().front().nsid;
  std::vector<std::unique_ptr<host::queue_pair>> queues;
  for (unsigned t = 0; t < sharing_threads; ++t) queues.push_back(ctrl->create_queue_pair(64));
  std::atomic<unsigned> failures{0};
  std::atomic<unsigned> first_rounds{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < sharing_threads; ++t) {
    threads.emplace_back([&, t] {
      host::dma_buffer out = ctrl->memory().allocate(sharing_blocks_per_command * sharing_block);
      host::dma_buffer in = ctrl->memory().allocate(sharing_blocks_per_command * sharing_block);
      const std::size_t words = sharing_blocks_per_command * sharing_block / 8;
      for (unsigned round = 0; round < rounds; ++round) {
        for (std::uint64_t at = 0; at < sharing_blocks_per_thread; at += sharing_blocks_per_command) {
          const std::uint64_t lba = sharing_first_lba(index, t) + at;
          auto* o = reinterpret_cast<std::uint64_t*>(out.data());
          for (std::size_t w = 0; w < words; ++w) o[w] = sharing_word(index, round, lba + w / (sharing_block / 8), w % (sharing_block / 8));
          if (queues[t]->write(nsid, lba, sharing_blocks_per_command, out) != spec::status::successful_completion) ++failures;
          std::memset(in.data(), 0, in.size());
          if (queues[t]->read(nsid, lba, sharing_blocks_per_command, in) != spec::status::successful_completion) ++failures;
          if (std::memcmp(in.data(), out.data(), words * 8) != 0) ++failures;
        }
        if (round == 0 && ++first_rounds == sharing_threads && !progress.empty()) std::ofstream(progress) << "running\n";
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
}

TEST_CASE("processes attached to one emulator drive their own queue pairs; one killed mid-I/O is reclaimed and the others finish, verified") {
  sharing_owner o("kill");
  const unsigned processes = 3, victim = 1, rounds = 40;
  std::vector<pid_t> pids;
  std::vector<std::string> progress;
  for (unsigned i = 0; i < processes; ++i) {
    progress.push_back(o.path + ".progress" + std::to_string(i));
    // The victim runs until killed; the others a fixed number of rounds.
    pids.push_back(spawn_sharing_child(o.path, i, i == victim ? 100000 : rounds, progress.back()));
  }
  // Killed once it has verified a round, with its commands still going.
  REQUIRE(sharing_eventually([&] { return sharing_exists(progress[victim]); }, 60s));
  CHECK(o.owner.queue_ids_held() >= sharing_threads);
  REQUIRE(::kill(pids[victim], SIGKILL) == 0);
  for (unsigned i = 0; i < processes; ++i) {
    CAPTURE(i);
    const int status = test::wait_bounded(pids[i], 120s);
    if (i == victim) {
      CHECK((status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    } else {
      CHECK((status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
  for (const auto& p : progress) ::unlink(p.c_str());
  // Every process is gone and reclaimed; the victim's queues were deleted by the owner.
  CHECK(sharing_eventually([&] { return o.owner.processes_reclaimed() == processes; }));
  CHECK(o.owner.queues_reclaimed() == 2 * sharing_threads);  // its SQs and CQs
  CHECK(o.owner.queue_ids_held() == 0);
  CHECK(o.owner.processes() == 0);
  // Its queues went before its memory: the controller never reached released memory.
  CHECK_FALSE(o.ctrl->csts().cfs());
  CHECK(dynamic_cast<host::emu_backend&>(o.ctrl->backend()).controller().dma().faults() == 0);

  // The survivors' last round is on the namespace, read by the owner's own queue pair.
  auto q = o.ctrl->create_queue_pair(64);
  host::dma_buffer in = o.ctrl->memory().allocate(sharing_blocks_per_thread * sharing_block);
  for (unsigned i = 0; i < processes; ++i) {
    if (i == victim) continue;
    for (unsigned t = 0; t < sharing_threads; ++t) {
      const std::uint64_t first = sharing_first_lba(i, t);
      REQUIRE(q->read(o.ctrl->namespaces().front().nsid, first, sharing_blocks_per_thread, in) == spec::status::successful_completion);
      const auto* words = reinterpret_cast<const std::uint64_t*>(in.data());
      std::size_t wrong = 0;
      for (std::size_t w = 0; w < sharing_blocks_per_thread * sharing_block / 8; ++w) {
        wrong += words[w] != sharing_word(i, rounds - 1, first + w / (sharing_block / 8), w % (sharing_block / 8));
      }
      CAPTURE(t);
      CHECK(wrong == 0);
    }
  }
  q.reset();
  // The victim's queue identifiers can be handed out again: every pair the owner does not use.
  auto again = host::open("attach:" + o.path);
  std::vector<std::unique_ptr<host::queue_pair>> all;
  for (std::uint16_t n = 0; n < o.ctrl->io_queue_pairs_granted(); ++n) all.push_back(again->create_queue_pair(16));
  CHECK(all.size() == o.ctrl->io_queue_pairs_granted());
}

TEST_CASE("a process asking for more queue pairs than remain is told how many are free and who holds the rest, at once") {
  sharing_owner o("exhaust", 4);
  auto first = host::open("attach:" + o.path);
  auto second = host::open("attach:" + o.path);
  CHECK(first->io_queue_pairs_granted() == 4);
  auto a = first->create_queue_pair(16);
  auto b = first->create_queue_pair(16);
  auto c = second->create_queue_pair(16);
  auto d = o.ctrl->create_queue_pair(16);  // the owner's own
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS((void)second->create_queue_pair(16), doctest::Contains("no I/O queue pair left: 0 of 4 free"), host::error);
  CHECK_THROWS_WITH_AS((void)second->create_queue_pair(16), doctest::Contains("holds 1, other processes 2, the owner the rest"), host::error);
  CHECK(std::chrono::steady_clock::now() - started < 2s);
  a.reset();  // given back: the next one gets it
  CHECK_NOTHROW((void)second->create_queue_pair(16));
}

TEST_CASE("an attached process keeps to its own queues: its backend refuses register writes; the owner refuses others' queues and memory and owner-only admin commands") {
  sharing_owner o("refuse");
  auto mine = host::open("attach:" + o.path);
  auto other = host::open("attach:" + o.path);
  auto theirs = other->create_queue_pair(16);
  // Registers below the doorbells are the owner's.
  CHECK_THROWS_WITH_AS(mine->backend().write32(spec::to_underlying(spec::register_offset::cc), 0), doctest::Contains("is the owner's"), host::error);
  // Another process's queue.
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_delete_io_sq(theirs->id()), "Delete I/O SQ"), doctest::Contains("is not process"),
                       host::error);
  // Set Features changes the controller for everybody.
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_set_number_of_queues(1, 1), "Set Features"), doctest::Contains("is the owner's alone"),
                       host::error);
  // Memory the owner cannot see.
  std::vector<std::byte> own(8192);
  CHECK_THROWS_WITH_AS((void)mine->memory().map_host(own.data(), 4096), doctest::Contains("memory().allocate"), host::error);
  // Another process's CQ for an SQ, another's SQ to abort, a queue in memory that is not its own.
  auto own_queue = mine->create_queue_pair(16);
  host::dma_buffer mine_memory = mine->memory().allocate(4096);
  host::dma_buffer their_memory = other->memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_create_io_sq(own_queue->id(), 16, mine_memory.bus(), theirs->id()), "Create I/O SQ"),
                       doctest::Contains("is no queue of process"), host::error);
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_abort(theirs->id(), 0), "Abort"), doctest::Contains("is not process"), host::error);
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_identify(spec::identify_cns::controller, 0, their_memory.bus()), "Identify"),
                       doctest::Contains("is not process"), host::error);
  CHECK_THROWS_WITH_AS((void)mine->admin_command(spec::make_identify(spec::identify_cns::controller, 0, 0), "Identify"),
                       doctest::Contains("is not process"), host::error);
  // Only the owner resets; the owner does not while processes hold queues.
  CHECK_THROWS_WITH_AS(mine->reset(), doctest::Contains("only the owner resets it"), host::error);
  CHECK_THROWS_WITH_AS(o.ctrl->reset(), doctest::Contains("lent to attached processes"), host::error);
  // The other process's queue still works.
  host::dma_buffer buf = other->memory().allocate(4096);
  CHECK(theirs->read(other->namespaces().front().nsid, 0, 8, buf) == spec::status::successful_completion);
}

TEST_CASE("sharing is refused clearly where it cannot work: nobody at the path, a private BAR0, a second owner at one path") {
  CHECK_THROWS_WITH_AS((void)host::open("attach:/tmp/cunvme-no-such-owner.sock"), doctest::Contains("no owner serves this socket"), host::error);
  auto private_bar = host::open("emu");
  CHECK_THROWS_WITH_AS(host::sharing::controller_owner(*private_bar, sharing_socket_path("private")), doctest::Contains("emu:shared"), host::error);
  sharing_owner o("twice");
  auto another = host::open("emu:shared");
  CHECK_THROWS_WITH_AS(host::sharing::controller_owner(*another, o.path), doctest::Contains("the path exists"), host::error);
}

TEST_CASE("an owner that stops serving reclaims the queues of the processes still attached, and they are told it is gone") {
  auto o = std::make_unique<sharing_owner>("stop");
  auto attached = host::open("attach:" + o->path);
  auto q = attached->create_queue_pair(16);
  CHECK(o->owner.queue_ids_held() == 1);
  std::unique_ptr<host::controller> owner_ctrl = std::move(o->ctrl);
  // The owner object goes, the controller stays (the owner's destructor deletes the queues).
  o.reset();
  CHECK_THROWS_WITH_AS((void)attached->create_queue_pair(16), doctest::Contains("is gone"), host::error);
  // Every identifier came back with its queues deleted: the owner's controller creates every pair.
  std::vector<std::unique_ptr<host::queue_pair>> all;
  for (std::uint16_t n = 0; n < owner_ctrl->io_queue_pairs_granted(); ++n) all.push_back(owner_ctrl->create_queue_pair(16));
  CHECK(all.size() == owner_ctrl->io_queue_pairs_granted());
  all.clear();
  q.reset();  // its Delete cannot reach the owner any more: its memory is kept, as for a controller that did not answer
  attached.reset();
  CHECK_NOTHROW(owner_ctrl->reset());  // nothing is lent any more
}

TEST_CASE("the owner stays up and keeps serving whatever a process sends it: bad memory files, sizes, descriptors without data") {
  sharing_owner o("wire");
  const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  const sockaddr_un address = host::sharing::socket_address(o.path, "test");
  REQUIRE(::connect(s, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  const auto ask = [&](const host::sharing::request& q, int fd = -1) {
    REQUIRE(host::sharing::send_message(s, q, fd));
    host::sharing::reply r;
    int got = -1;
    REQUIRE(host::sharing::receive_message(s, r, got) == host::sharing::receive_status::message);
    if (got >= 0) ::close(got);
    return r;
  };
  host::sharing::request hello{host::sharing::request_kind::hello};
  hello.a = 99;
  CHECK(std::string(ask(hello).text).find("wire version") != std::string::npos);
  hello.a = host::sharing::wire_version;
  CHECK(ask(hello).failed == 0);
  // A memory file that is not sealed against shrinking.
  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(::ftruncate(unsealed, 4096) == 0);
  host::sharing::request map{host::sharing::request_kind::map_memory};
  map.a = 4096;
  map.b = 4096;
  CHECK(std::string(ask(map, unsealed).text).find("not sealed") != std::string::npos);
  ::close(unsealed);
  // More than the file holds; more than half the machine; no file at all.
  const int sealed = ::memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(::ftruncate(sealed, 4096) == 0);
  REQUIRE(::fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
  map.a = std::uint64_t{1} << 40;
  CHECK(std::string(ask(map, sealed).text).find("does not hold") != std::string::npos);
  map.a = 4096;
  CHECK(std::string(ask(map).text).find("no memory file") != std::string::npos);
  // GPU memory where the owner's emulator has no GPU reach; a queue identifier not its own.
  CHECK(std::string(ask(host::sharing::request{host::sharing::request_kind::map_gpu}).text).find("GPU") != std::string::npos);
  host::sharing::request release{host::sharing::request_kind::release_queue_id};
  release.a = 3;
  CHECK(std::string(ask(release).text).find("is not process") != std::string::npos);
  // An empty message carrying a descriptor is refused, and the descriptor is not kept.
  {
    iovec io{nullptr, 0};
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &sealed, sizeof sealed);
    REQUIRE(::sendmsg(s, &m, MSG_NOSIGNAL) == 0);
    host::sharing::reply r;
    int got = -1;
    REQUIRE(host::sharing::receive_message(s, r, got) == host::sharing::receive_status::message);
    CHECK(std::string(r.text).find("malformed") != std::string::npos);
  }
  ::close(sealed);
  ::close(s);
  // The owner serves on.
  auto attached = host::open("attach:" + o.path);
  auto q = attached->create_queue_pair(16);
  host::dma_buffer buf = attached->memory().allocate(4096);
  CHECK(q->read(attached->namespaces().front().nsid, 0, 8, buf) == spec::status::successful_completion);
}

TEST_CASE("a queue identifier given back is released only with its queues deleted, and memory holding a live queue stays on the bus") {
  sharing_owner o("release");
  auto attached = host::open("attach:" + o.path);
  auto q = attached->create_queue_pair(16);
  CHECK(o.owner.queue_ids_held() == 1);
  // The memory of its live SQ cannot leave the bus (the controller would fetch from it).
  auto& owner_link = dynamic_cast<host::sharing::attached_backend&>(attached->backend()).owner();
  host::sharing::request unmap{host::sharing::request_kind::unmap_memory};
  unmap.a = q->sq_bus();
  CHECK_THROWS_WITH_AS((void)owner_link.call(unmap, "Release DMA memory"), doctest::Contains("lies in this memory: delete it first"), host::error);
  // Giving back an identifier whose queues are live: the owner deletes them first.
  host::sharing::request give_back{host::sharing::request_kind::release_queue_id};
  give_back.a = q->id();
  CHECK_NOTHROW((void)owner_link.call(give_back, "Release I/O queue"));
  CHECK(o.owner.queue_ids_held() == 0);
  CHECK(o.ctrl->admin_command(spec::make_delete_io_sq(q->id()), "Delete I/O SQ").status() == spec::status::invalid_queue_identifier);
  q.reset();  // its own Delete finds the queues gone; it gives the identifier back again, which is refused quietly
  CHECK(o.owner.queue_ids_held() == 0);
  CHECK_FALSE(o.ctrl->csts().cfs());
}

TEST_CASE("a shared BAR0 is registered for this process's GPU threads through the memory hooks, and a refusal stops the build") {
  // The owner's own devices ring doorbells in the shared BAR0 as in one from `allocate`.
  int registered = 0, unregistered = 0;
  {
    emu::controller_config config;
    config.shared_bar = true;
    config.memory.register_bar = [&](void* p, std::size_t bytes) {
      ++registered;
      return p != nullptr && bytes >= 0x2000;
    };
    config.memory.unregister_bar = [&](void*) { ++unregistered; };
    emu::controller ctrl(config);
    CHECK(ctrl.bar_file() >= 0);
    CHECK(registered == 1);
  }
  CHECK(unregistered == 1);
  emu::controller_config refusing;
  refusing.shared_bar = true;
  refusing.memory.register_bar = [](void*, std::size_t) { return false; };
  CHECK_THROWS_WITH_AS(emu::controller{refusing}, doctest::Contains("could not be registered for GPU threads"), std::runtime_error);
}
