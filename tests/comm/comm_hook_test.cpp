// DDP's comm hook choice: every hook's name parses back to it, and an unknown name is an error
// that lists the choices (what ringgrad-train's --comm-hook passes through).
#include <gtest/gtest.h>

#include <string>

#include "comm/reducer.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

TEST(CommHook, EveryNameParsesBackToItsHook) {
  for (CommHook h : {CommHook::allreduce, CommHook::fp16, CommHook::bf16, CommHook::powersgd})
    EXPECT_EQ(parse_comm_hook(comm_hook_name(h)), h) << comm_hook_name(h);
  EXPECT_EQ(std::string(comm_hook_name(DdpOptions{}.comm_hook)), "allreduce");
}

TEST(CommHook, AnUnknownNameListsTheChoices) {
  const std::string e = rg::testing::error_of([] { (void)parse_comm_hook("fp8"); });
  EXPECT_NE(e.find("unknown DDP comm hook 'fp8'"), std::string::npos) << e;
  EXPECT_NE(e.find("allreduce, fp16, bf16 or powersgd"), std::string::npos) << e;
}

}  // namespace
}  // namespace rg::dist
