/* meshwit: hooks for testing failure paths. Not for production use. */
#ifndef MESHWIT_TESTING_H
#define MESHWIT_TESTING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the n-th host allocation made by meshwit from now on fail (n >= 1), once; n <= 0 disarms
 * it. Process-wide and thread-safe. Every call that hits the failure returns MW_ERR_NOMEM and
 * leaks nothing. */
void mw_test_fail_allocation(int64_t n);

/* Host allocations meshwit attempted since the last mw_test_fail_allocation call. */
int64_t mw_test_allocations(void);

#ifdef __cplusplus
}
#endif
#endif
