// Deterministic, seeded fault injection for the emulator, with counters of what it injected.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/spec/status.cuh>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// What a fault rule does to a command it fires on.
enum class fault_action : std::uint8_t {
  /// The command completes with `fault_rule::status` (and its DNR bit) instead of its own
  /// status. It still executes: an injected read error does not stop the data moving, as a
  /// real drive may have moved part of it. Use it to test a host's error paths and retries.
  complete_with_status,
  /// The completion is posted `fault_rule::delay_ns` later than it would have been. Use it
  /// for latency outliers and for timeouts that eventually resolve.
  add_delay,
  /// The command executes but its completion is never posted, as when a drive drops it.
  /// Use it to test a host's command timeouts and aborts.
  lose_completion,
  /// The controller reports Controller Fatal Status (CSTS.CFS) and stops processing commands
  /// until it is reset. Use it to test a host's reset and recovery path.
  controller_fatal,
};

/// Which commands a rule applies to, when it fires among them, and what it does.
///
/// A command matches when every condition holds: its queue type (`admin`), `opcode` and
/// `sqid` where given, and, where `lba_first`/`lba_last` narrow the range, an LBA range that
/// meets [lba_first, lba_last] (a command without LBAs then does not match). Among matching
/// commands the rule fires once on the `nth`, or on a `fraction` chosen by a seeded hash of
/// the command, at most `max_fires` times.
///
/// Usage: examples/snippets/emu.cpp, `one_percent_of_reads_fail`.
struct fault_rule {
  fault_action action = fault_action::complete_with_status;
  spec::status status = spec::status::successful_completion;  ///< for complete_with_status; must be an error
  bool dnr = true;                                            ///< Do Not Retry bit of the injected status
  std::uint64_t delay_ns = 0;                                 ///< for add_delay; must be > 0

  // ---- which commands ------------------------------------------------------------------------
  std::optional<std::uint8_t> opcode{};  ///< any opcode when empty
  bool admin = false;                  ///< admin-queue commands instead of I/O commands
  std::uint64_t lba_first = 0;         ///< I/O commands whose LBAs meet [lba_first, lba_last]; the
  std::uint64_t lba_last = std::numeric_limits<std::uint64_t>::max();  ///< full default range matches any command
  std::optional<std::uint16_t> sqid{};  ///< any queue when empty

  // ---- when, among them ----------------------------------------------------------------------
  std::uint64_t nth = 0;   ///< fire once, on the nth matching command (1-based); 0: use `fraction`
  double fraction = 0;     ///< fire on this fraction of matching commands, in [0, 1]
  std::uint64_t max_fires = std::numeric_limits<std::uint64_t>::max();
};

/// What the injector needs to know of a command.
struct command_view {
  bool admin = false;          ///< submitted to the admin queue
  std::uint16_t sqid = 0;
  std::uint16_t cid = 0;
  std::uint8_t opcode = 0;
  std::uint64_t sequence = 0;  ///< how many commands its SQ had delivered before it
  bool has_lba = false;        ///< the command addresses LBAs (Read, Write, Write Zeroes, …)
  std::uint64_t slba = 0;      ///< first LBA, when has_lba
  std::uint32_t nlb = 0;       ///< number of LBAs, 1-based (NLB field + 1), when has_lba
};

/// The faults to apply to one command; several rules may contribute.
struct fault_decision {
  std::optional<spec::status> status{};  ///< the status to complete with instead of the command's own
  bool dnr = true;                     ///< DNR bit to post with `status`
  std::uint64_t extra_delay_ns = 0;    ///< sum of the delays of every add_delay rule that fired
  bool lose_completion = false;
  bool controller_fatal = false;

  /// Whether any fault applies.
  [[nodiscard]] bool any() const noexcept {
    return status.has_value() || extra_delay_ns != 0 || lose_completion || controller_fatal;
  }
};

/// How many times rules of each action fired; a snapshot.
struct fault_counters {
  std::uint64_t statuses = 0;
  std::uint64_t delays = 0;
  std::uint64_t lost_completions = 0;
  std::uint64_t controller_fatals = 0;
};

/// Applies fault rules to commands; `decide` is safe to call from any number of threads.
///
/// Reproducible: whether a `fraction` rule fires on a command is a hash of (seed, rule
/// index, SQ, CID, sequence number in the SQ), so a given command stream draws the same
/// faults on every run whatever the worker threads' interleaving. What does depend on the
/// interleaving, when several queues feed one rule, is which command is a rule's nth and,
/// once `max_fires` is reached, which firings were the first.
///
/// Every rule whose conditions match is applied, in rule order, so one command may draw a
/// delay and a status, say. A command gets at most one injected status: once a rule has
/// given it one, later complete_with_status rules skip the command and do not count it.
///
/// Usage: examples/snippets/emu.cpp, `third_read_fails`.
class fault_injector {
 public:
  /// An injector that injects nothing.
  fault_injector() = default;

  /// Checks every rule and throws std::invalid_argument naming the first bad rule's index
  /// and why: a fraction outside [0, 1]; both or neither of nth and fraction (neither would
  /// never fire); complete_with_status without an error status, or with one wider than the
  /// 11-bit SCT/SC field; add_delay without a delay; lba_first above lba_last; an LBA range
  /// on an admin rule (admin commands carry no LBAs); max_fires of 0; an unknown action.
  fault_injector(std::vector<fault_rule> rules, std::uint64_t seed)
      : rules_(std::move(rules)), seed_(seed), state_(std::make_unique<rule_state[]>(rules_.size())) {
    for (std::size_t i = 0; i < rules_.size(); ++i) validate(i, rules_[i]);
  }

  fault_injector(const fault_injector&) = delete;
  fault_injector& operator=(const fault_injector&) = delete;

  /// The faults for command `c`; counts it against every rule it matches.
  [[nodiscard]] fault_decision decide(const command_view& c) {
    fault_decision d;
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      const fault_rule& r = rules_[i];
      if (r.action == fault_action::complete_with_status && d.status) continue;
      if (!matches(r, c) || !fires(i, r, c) || !take_fire(state_[i], r)) continue;
      switch (r.action) {
        case fault_action::complete_with_status:
          d.status = r.status;
          d.dnr = r.dnr;
          counters_.statuses.fetch_add(1, std::memory_order_relaxed);
          break;
        case fault_action::add_delay:
          d.extra_delay_ns = cunvme::detail::saturating_add(d.extra_delay_ns, r.delay_ns);
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

  /// How many times rules of each action have fired so far.
  [[nodiscard]] fault_counters counters() const noexcept {
    return fault_counters{counters_.statuses.load(std::memory_order_relaxed),
                          counters_.delays.load(std::memory_order_relaxed),
                          counters_.lost_completions.load(std::memory_order_relaxed),
                          counters_.controller_fatals.load(std::memory_order_relaxed)};
  }

  /// How many times rule `rule_index` has fired; std::out_of_range for a rule that does not exist.
  [[nodiscard]] std::uint64_t fired(std::size_t rule_index) const {
    if (rule_index >= rules_.size()) {
      throw std::out_of_range("fault_injector::fired: no rule " + std::to_string(rule_index) + " among " +
                              std::to_string(rules_.size()));
    }
    return state_[rule_index].fired.load(std::memory_order_relaxed);
  }

  /// Why rule `r` can never apply as written (the constructor's checks, each reason a phrase
  /// that follows "rule N"), or nothing: for front ends such as `emu:fault=` that name the rule
  /// their own way.
  [[nodiscard]] static std::optional<std::string> problem(const fault_rule& r) {
    switch (r.action) {
      case fault_action::complete_with_status:
        if (r.status == spec::status::successful_completion) {
          return std::string("completes with Successful Completion: complete_with_status needs an error status");
        }
        if (static_cast<unsigned>(r.status) > 0x7ffu) {
          return std::string("has status " + std::to_string(static_cast<unsigned>(r.status)) +
                 ", wider than the 11-bit SCT/SC field of a completion");
        }
        break;
      case fault_action::add_delay:
        if (r.delay_ns == 0) return std::string("is add_delay with delay_ns 0");
        break;
      case fault_action::lose_completion:
      case fault_action::controller_fatal:
        break;
      default:
        return std::string("has unknown action " + std::to_string(static_cast<unsigned>(r.action)));
    }
    if (std::isnan(r.fraction) || r.fraction < 0 || r.fraction > 1) {
      return std::string("has fraction " + std::to_string(r.fraction) + ", outside [0, 1]");
    }
    if (r.nth != 0 && r.fraction != 0) {
      return std::string("sets both nth (" + std::to_string(r.nth) + ") and fraction (" + std::to_string(r.fraction) +
             "): give one");
    }
    if (r.nth == 0 && r.fraction == 0) return std::string("sets neither nth nor fraction, so it would never fire");
    if (r.max_fires == 0) return std::string("has max_fires 0, so it would never fire");
    if (r.lba_first > r.lba_last) {
      return std::string("has lba_first " + std::to_string(r.lba_first) + " above lba_last " + std::to_string(r.lba_last));
    }
    if (r.admin && !full_lba_range(r)) return std::string("is an admin rule with an LBA range: admin commands carry no LBAs");
    return std::nullopt;
  }

 private:
  // Counters that several workers bump sit on lines of their own.
  struct alignas(64) rule_state {
    std::atomic<std::uint64_t> matched{0};  ///< matching commands seen (nth rules only)
    std::atomic<std::uint64_t> fired{0};
  };
  struct alignas(64) atomic_counters {
    std::atomic<std::uint64_t> statuses{0}, delays{0}, lost_completions{0}, controller_fatals{0};
  };

  static void validate(std::size_t index, const fault_rule& r) {
    if (auto why = problem(r)) throw std::invalid_argument("fault_injector: rule " + std::to_string(index) + " " + *why);
  }

  [[nodiscard]] static bool full_lba_range(const fault_rule& r) noexcept {
    return r.lba_first == 0 && r.lba_last == std::numeric_limits<std::uint64_t>::max();
  }

  [[nodiscard]] static bool matches(const fault_rule& r, const command_view& c) noexcept {
    if (r.admin != c.admin) return false;
    if (r.opcode && *r.opcode != c.opcode) return false;
    if (r.sqid && *r.sqid != c.sqid) return false;
    if (full_lba_range(r)) return true;
    if (!c.has_lba || c.nlb == 0) return false;
    // The command's last LBA, clamped rather than wrapped for a range running off the end.
    const std::uint64_t span = c.nlb - 1u;
    const std::uint64_t last =
        c.slba > std::numeric_limits<std::uint64_t>::max() - span ? std::numeric_limits<std::uint64_t>::max() : c.slba + span;
    return c.slba <= r.lba_last && last >= r.lba_first;
  }

  /// Whether rule `index` picks matching command `c`.
  [[nodiscard]] bool fires(std::size_t index, const fault_rule& r, const command_view& c) noexcept {
    if (r.nth == 0) return unit_interval(hash(index, c)) < r.fraction;
    // Stop counting once past the nth: later commands would only bounce the counter's line.
    std::atomic<std::uint64_t>& matched = state_[index].matched;
    if (matched.load(std::memory_order_relaxed) >= r.nth) return false;
    return matched.fetch_add(1, std::memory_order_relaxed) + 1 == r.nth;
  }

  /// Counts one firing unless the rule has reached max_fires, so `fired` never exceeds it.
  [[nodiscard]] static bool take_fire(rule_state& s, const fault_rule& r) noexcept {
    std::uint64_t n = s.fired.load(std::memory_order_relaxed);
    do {
      if (n >= r.max_fires) return false;
    } while (!s.fired.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    return true;
  }

  [[nodiscard]] static constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  /// Each input is mixed in by a full splitmix64 round, so neighbouring seeds, rules, CIDs or
  /// sequence numbers give unrelated draws.
  [[nodiscard]] std::uint64_t hash(std::size_t rule, const command_view& c) const noexcept {
    std::uint64_t h = splitmix64(seed_);
    h = splitmix64(h ^ static_cast<std::uint64_t>(rule));
    h = splitmix64(h ^ (std::uint64_t{c.sqid} << 16 | c.cid));
    return splitmix64(h ^ c.sequence);
  }

  /// The top 53 bits of `h` as a double in [0, 1): a fraction of 1 always fires, 0 never.
  [[nodiscard]] static constexpr double unit_interval(std::uint64_t h) noexcept {
    return static_cast<double>(h >> 11) * 0x1p-53;
  }

  std::vector<fault_rule> rules_;
  std::uint64_t seed_ = 0;
  std::unique_ptr<rule_state[]> state_;
  atomic_counters counters_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
