/* tests/papers/test_sglang_neurips24.c — papers/sglang-neurips24/reproduce.py run end to end through $KVPAGE_BIN:
 * every claim within its band, and the committed results/claims.csv still what the code measures (1 % allowed). */
#include "papers_testutil.h"

Test(sglang_neurips24, every_claim_is_within_its_band_and_the_committed_results_are_current)
{
    kvp_paper_check("sglang-neurips24", 14);
}

Test(sglang_neurips24, a_missing_kvpage_fails_loudly)
{
    kvp_paper_missing_kvpage("sglang-neurips24");
}
