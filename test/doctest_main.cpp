// The one doctest main shared by every test program.
//
// A run that selects no test case fails: each test file of a suite runs as the suite's program
// filtered to that file (--source-file, test/meson.build), and a filter that missed the file's
// cases would otherwise pass by running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

bool run_ended = false;
unsigned selected_cases = 0;

struct selection_listener : doctest::IReporter {
  explicit selection_listener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    run_ended = true;
    selected_cases = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("selection", 1, selection_listener);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  // Queries (--list-test-cases, --help, ...) end without a run.
  if (run_ended && selected_cases == 0) {
    std::fputs("doctest_main: no test case passed the filters: this run tested nothing\n", stderr);
    return result == 0 ? 1 : result;
  }
  return result;
}
