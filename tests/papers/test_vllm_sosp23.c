/* tests/papers/test_vllm_sosp23.c — the PagedAttention paper's reproduction (papers/vllm-sosp23/reproduce.py)
 * run end to end through $KVPAGE_BIN: every claim within its band, and the committed results/claims.csv
 * still what the code measures (the simulation is deterministic; 1 % allowed for floating-point noise). */
#include "papers_testutil.h"

Test(vllm_sosp23, every_claim_is_within_its_band_and_the_committed_results_are_current)
{
    kvp_paper_check("vllm-sosp23", 44);
}

Test(vllm_sosp23, a_missing_kvpage_fails_loudly)
{
    kvp_paper_missing_kvpage("vllm-sosp23");
}
