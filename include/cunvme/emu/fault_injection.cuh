// Deterministic, seeded fault injection for the emulator, with counters of what it injected.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/status.cuh>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu {

enum class fault_action : std::uint8_t {
  complete_with_status,  ///< the command completes with `fault_rule::status`
  add_delay,             ///< its completion comes `fault_rule::delay_ns` later
  lose_completion,       ///< it executes but its completion is never posted
  controller_fatal,      ///< the controller sets CSTS.CFS and stops until reset
};

/// Which commands a rule applies to, when it fires, and what it does.
///
/// ```
/// emu::fault_rule r;                       // every 100th read (on average) fails
/// r.status = spec::status::unrecovered_read_error;
/// r.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
/// r.fraction = 0.01;
/// ```
struct fault_rule {
  fault_action action = fault_action::complete_with_status;
  spec::status status = spec::status::successful_completion;  ///< for complete_with_status
  bool dnr = true;                                            ///< Do Not Retry on the injected status
  std::uint64_t delay_ns = 0;                                 ///< for add_delay
  // Matching: all given conditions hold.
  std::optional<std::uint8_t> opcode;  ///< any opcode when empty
  bool admin = false;                  ///< admin-queue commands instead of I/O commands
  std::uint64_t lba_first = 0;         ///< I/O commands whose LBAs meet [lba_first, lba_last];
  std::uint64_t lba_last = std::numeric_limits<std::uint64_t>::max();  ///< commands without LBAs match only the full range
  std::optional<std::uint16_t> sqid;
  // Firing, among matching commands.
  std::uint64_t nth = 0;      ///< fire once, on the nth (1-based); 0: use `fraction`
  double fraction = 0;        ///< fire on this fraction, decided per command by a seeded hash
  std::uint64_t max_fires = std::numeric_limits<std::uint64_t>::max();
};

/// What the injector knows of a command.
struct command_view {
  bool admin = false;
  std::uint16_t sqid = 0;
  std::uint16_t cid = 0;
  std::uint8_t opcode = 0;
  std::uint64_t sequence = 0;  ///< the command's position in its SQ
  bool has_lba = false;
  std::uint64_t slba = 0;
  std::uint32_t nlb = 0;       ///< blocks, 1-based
};

struct fault_decision {
  std::optional<spec::status> status;
  bool dnr = true;
  std::uint64_t extra_delay_ns = 0;
  bool lose_completion = false;
  bool controller_fatal = false;
  [[nodiscard]] bool any() const noexcept { return status || extra_delay_ns != 0 || lose_completion || controller_fatal; }
};

struct fault_counters {
  std::uint64_t statuses = 0;
  std::uint64_t delays = 0;
  std::uint64_t lost_completions = 0;
  std::uint64_t controller_fatals = 0;
};

/// Applies fault rules to commands; safe to call from many threads.
///
/// Fractions are decided by a hash of (seed, rule, SQ, CID, position in the SQ), so the same
/// command stream gets the same faults whatever the threads' interleaving.
class fault_injector {
 public:
  fault_injector() = default;
  fault_injector(std::vector<fault_rule> rules, std::uint64_t seed) : rules_(std::move(rules)), seed_(seed) {
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      const auto& r = rules_[i];
      auto bad = [&](const std::string& why) {
        throw std::invalid_argument("fault_injector: rule " + std::to_string(i) + ": " + why);
      };
      if (!(r.fraction >= 0.0 && r.fraction <= 1.0)) bad("fraction must lie in [0, 1]");
      if (r.nth != 0 && r.fraction != 0) bad("give nth or fraction, not both");
      if (r.nth == 0 && r.fraction == 0) bad("give nth or fraction: the rule would never fire");
      if (r.action == fault_action::complete_with_status && r.status == spec::status::successful_completion) {
        bad("complete_with_status needs an error status");
      }
      if (r.action == fault_action::add_delay && r.delay_ns == 0) bad("add_delay needs delay_ns");
      if (r.lba_first > r.lba_last) bad("lba_first is above lba_last");
    }
    state_ = std::make_unique<rule_state[]>(rules_.size());
  }

  [[nodiscard]] fault_decision decide(const command_view& c) {
    fault_decision d;
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      const fault_rule& r = rules_[i];
      if (!matches(r, c)) continue;
      rule_state& s = state_[i];
      const std::uint64_t n = s.matched.fetch_add(1, std::memory_order_relaxed) + 1;
      const bool hit = r.nth != 0 ? n == r.nth : unit(hash(c, i)) < r.fraction;
      if (!hit) continue;
      if (s.fired.fetch_add(1, std::memory_order_relaxed) >= r.max_fires) {
        s.fired.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      switch (r.action) {
        case fault_action::complete_with_status:
          d.status = r.status;
          d.dnr = r.dnr;
          counters_.statuses.fetch_add(1, std::memory_order_relaxed);
          break;
        case fault_action::add_delay:
          d.extra_delay_ns += r.delay_ns;
          counters_.delays.fetch_add(1, std::memory_order_relaxed);
          break;
        case fault_action::lose_completion:
          d.lose_completion = true;
          counters_.lost_completions.fetch_add(1, std::memory_order_relaxed);
          break;
        case fault_action::controller_fatal:
          d.controller_fatal = true;
          counters_.controller_fatals.fetch_add(1, std::memory_order_relaxed);
          break;
      }
    }
    return d;
  }

  [[nodiscard]] fault_counters counters() const noexcept {
    return fault_counters{counters_.statuses.load(), counters_.delays.load(), counters_.lost_completions.load(),
                          counters_.controller_fatals.load()};
  }
  /// How often rule `index` fired.
  [[nodiscard]] std::uint64_t fired(std::size_t index) const {
    if (index >= rules_.size()) throw std::out_of_range("fault_injector::fired: no rule " + std::to_string(index));
    return state_[index].fired.load(std::memory_order_relaxed);
  }

 private:
  struct rule_state {
    std::atomic<std::uint64_t> matched{0};
    std::atomic<std::uint64_t> fired{0};
  };
  struct atomic_counters {
    std::atomic<std::uint64_t> statuses{0}, delays{0}, lost_completions{0}, controller_fatals{0};
  };

  [[nodiscard]] static bool matches(const fault_rule& r, const command_view& c) noexcept {
    if (r.admin != c.admin) return false;
    if (r.opcode && *r.opcode != c.opcode) return false;
    if (r.sqid && *r.sqid != c.sqid) return false;
    const bool full_range = r.lba_first == 0 && r.lba_last == std::numeric_limits<std::uint64_t>::max();
    if (full_range) return true;
    if (!c.has_lba || c.nlb == 0) return false;
    const std::uint64_t last = c.slba + (c.nlb - 1u);
    return c.slba <= r.lba_last && last >= r.lba_first;
  }

  static std::uint64_t splitmix64(std::uint64_t x) noexcept {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  [[nodiscard]] std::uint64_t hash(const command_view& c, std::size_t rule) const noexcept {
    std::uint64_t h = splitmix64(seed_ ^ (std::uint64_t{rule} << 56));
    h = splitmix64(h ^ (std::uint64_t{c.sqid} << 32 | c.cid));
    return splitmix64(h ^ c.sequence);
  }
  static double unit(std::uint64_t h) noexcept { return static_cast<double>(h >> 11) * 0x1.0p-53; }

  std::vector<fault_rule> rules_;
  std::uint64_t seed_ = 0;
  std::unique_ptr<rule_state[]> state_;
  atomic_counters counters_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
