/* Shape simplification shared by the backends. */
#include <string.h>

#include "devices/device.h"

void mw__nd_simplify(mw__nd *nd, int nops) {
    mw__nd s = {0};
    for (int i = 0; i < nd->rank; i++) {
        if (nd->dims[i] == 1) continue;
        if (s.rank > 0) {
            int j = s.rank - 1, merge = 1;
            for (int k = 0; k < nops; k++)
                merge &= s.stride[k][j] == nd->stride[k][i] * nd->dims[i];
            if (merge) {
                s.dims[j] *= nd->dims[i];
                for (int k = 0; k < nops; k++) s.stride[k][j] = nd->stride[k][i];
                continue;
            }
        }
        s.dims[s.rank] = nd->dims[i];
        for (int k = 0; k < nops; k++) s.stride[k][s.rank] = nd->stride[k][i];
        s.rank++;
    }
    *nd = s;
}
