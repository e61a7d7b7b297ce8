/* Links against an installed meshwit and makes a graph. Exit status 0 means it worked. */
#include <meshwit.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    char header[32];
    snprintf(header, sizeof header, "%d.%d.%d", MESHWIT_VERSION_MAJOR, MESHWIT_VERSION_MINOR,
             MESHWIT_VERSION_PATCH);
    if (strcmp(mw_version(), header) != 0) {
        fprintf(stderr, "library version %s differs from header version %s\n", mw_version(),
                header);
        return 1;
    }
    mw_graph *g = NULL;
    mw_status st = mw_graph_new(&g);
    if (st != MW_OK || g == NULL) {
        fprintf(stderr, "mw_graph_new: %s\n", mw_strerror(st));
        return 1;
    }
    mw_graph_free(g);
    /* Pulls in the CUDA backend (when built with it): its libraries must link too. */
    int gpus = mw_cuda_device_count();
    printf("meshwit %s: ok, %d CUDA device(s)\n", mw_version(), gpus);
    return 0;
}
