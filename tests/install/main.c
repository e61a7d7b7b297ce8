/* A CPU-only program built against an installed meshwit (the `install` test): trains a small
 * linear regression on cpu:2, then checks from its own /proc/self/maps that none of CUDA, cuBLAS,
 * NCCL or MPI is mapped (they live in modules that only a cuda: device or mpirun loads), and
 * prints its peak resident memory. Exit status 0 means all of it held. */
#include <meshwit.h>
#include <stdio.h>
#include <string.h>

/* The first mapped library whose name contains one of the forbidden parts, or NULL. */
static const char *forbidden_mapping(char *line, size_t cap) {
    static const char *const parts[] = {"libcudart", "libcublas",       "libnccl",
                                        "libmpi",    "libmeshwit-cuda", "libmeshwit-mpi"};
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return NULL;
    const char *hit = NULL;
    while (!hit && fgets(line, (int)cap, f))
        for (size_t i = 0; i < sizeof parts / sizeof *parts && !hit; i++)
            if (strstr(line, parts[i])) hit = parts[i];
    fclose(f);
    return hit;
}

/* VmHWM of /proc/self/status in kB, or -1. */
static long peak_rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) sscanf(line + 6, "%ld", &kb);
    if (f) fclose(f);
    return kb;
}

static int fail(const char *what, mw_status st) {
    fprintf(stderr, "%s: %s: %s\n", what, mw_status_name(st), mw_last_error());
    return 1;
}

int main(void) {
    char header[32];
    snprintf(header, sizeof header, "%d.%d.%d", MESHWIT_VERSION_MAJOR, MESHWIT_VERSION_MINOR,
             MESHWIT_VERSION_PATCH);
    if (strcmp(mw_version(), header) != 0) {
        fprintf(stderr, "library version %s differs from header version %s\n", mw_version(),
                header);
        return 1;
    }
    /* y = 2 x0 - x1 + 0.5 over 64 rows, sharded over two CPU devices. */
    enum { N = 64 };
    float x[N * 2], y[N];
    for (int i = 0; i < N; i++) {
        x[2 * i] = (float)(i % 8) / 8.0f;
        x[2 * i + 1] = (float)(i / 8) / 8.0f;
        y[i] = 2.0f * x[2 * i] - x[2 * i + 1] + 0.5f;
    }
    mw_graph *g = NULL;
    mw_status st = mw_graph_new(&g);
    if (st) return fail("mw_graph_new", st);
    mw_tensor *xs =
        mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", N}, {"F", 2})), "Batch", "X");
    mw_tensor *ys = mw_shard(g, mw_input(g, "y", MW_F32, MW_AXES({"Batch", N})), "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"F", 2}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_SCALAR, MW_INIT_ZEROS);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, xs, w, "F"), b), ys);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    if ((st = mw_graph_status(g))) return fail("graph", st);
    if ((st = mw_mesh_new("cpu:2", "X", &mesh))) return fail("mw_mesh_new", st);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.5f}};
    if ((st = mw_trainer_new(g, loss, mesh, &cfg, &tr))) return fail("mw_trainer_new", st);
    mw_feed feeds[2] = {{"x", x, N * 2}, {"y", y, N}};
    float first = 0, last = 0;
    for (int s = 0; s < 300; s++)
        if ((st = mw_trainer_step(tr, feeds, 2, s ? &last : &first))) return fail("step", st);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    if (!(last < 1e-3f * first)) {
        fprintf(stderr, "training did not converge: loss %g -> %g\n", first, last);
        return 1;
    }
    char line[4096];
    const char *hit = forbidden_mapping(line, sizeof line);
    if (hit) {
        fprintf(stderr, "a CPU-only program maps %s:\n%s", hit, line);
        return 1;
    }
    printf("meshwit %s: ok, loss %.3g -> %.3g on cpu:2, no CUDA/NCCL/MPI mapped, peak RSS %ld kB\n",
           mw_version(), first, last, peak_rss_kb());
    return 0;
}
