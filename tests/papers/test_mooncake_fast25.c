/* tests/papers/test_mooncake_fast25.c — papers/mooncake-fast25/reproduce.py run end to end through $KVPAGE_BIN:
 * every claim within its band, and the committed results/claims.csv still what the code measures (1 % allowed). */
#include "papers_testutil.h"

Test(mooncake_fast25, every_claim_is_within_its_band_and_the_committed_results_are_current)
{
    kvp_paper_check("mooncake-fast25", 27);
}

Test(mooncake_fast25, a_missing_kvpage_fails_loudly)
{
    kvp_paper_missing_kvpage("mooncake-fast25");
}
