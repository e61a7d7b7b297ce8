/* The soak case: thousands of steps of a small GPT-2 sharded over oversubscribed virtual devices
 * (cpu:4 on a 2-core machine), with evals, injected device faults and checkpoint round trips
 * mixed in, to show that memory stays flat: the peak RSS at the end is compared with the peak
 * after the first 100 steps. Two round trips happen before step 100: glibc raises its mmap
 * threshold when the first large checkpoint buffer is freed, so the second one comes from the
 * heap and sets the process's steady-state peak once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "gpt2_model.h"
#include "meshwit/testing.h"

/* A field of /proc/self/status in kB (VmRSS, VmHWM), or -1 where it is not available. */
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

int mwb_case_soak(mwb_ctx *ctx) {
    const char *devices = ctx->ndevices ? ctx->devices[0] : "cpu:4";
    const int steps = ctx->quick ? 300 : 3000, B = 8, T = 16;
    const gpt2_config c = {
        .layers = 2, .heads = 2, .channels = 32, .max_seq = T, .vocab = 64, .padded_vocab = 64};
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    gpt2_graph m;
    int32_t tok[8 * 16 + 1];
    char dir[4096], ckpt[4200];
    if (mwb_private_dir(dir, sizeof dir) != 0) return 1;
    snprintf(ckpt, sizeof ckpt, "%s/soak.mwc", dir);
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f}};
    int rc = 1, faults = 0;
    long rss100 = -1, hwm100 = -1;
    /* The peak so far belongs to earlier cases of this run: reset it (Linux: writing 5 to
     * clear_refs resets the peak RSS to the current RSS). */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (cr) {
        fputs("5", cr);
        fclose(cr);
    }
    double t0 = mwb_now();
    if (mw_graph_new(&g) ||
        gpt2_build(g, &c, &(gpt2_layout){.batch = B, .seq = T, .data_axis = "X"}, &m) ||
        mw_mesh_new(devices, "X", &mesh) || mw_trainer_new(g, m.loss, mesh, &cfg, &tr))
        goto done;
    mw_feed feeds[2] = {{"tokens", tok, B * T}, {"targets", tok + 1, B * T}};
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < B * T + 1; i++) tok[i] = (int32_t)((i * 5 + s * 3 + i / 7) % 64);
        if (s % 97 == 50) { /* a device fails now and then; the run goes on */
            mw_test_control(MW_TEST_FAULT, tr, s % mw_mesh_size(mesh), (mw_phase)(s % 5),
                            (int64_t)(mw_trainer_steps(tr)), MW_ERR_DEVICE);
            if (mw_trainer_step(tr, feeds, 2, NULL) != MW_ERR_DEVICE) goto done;
            faults++;
        }
        float loss;
        if (mw_trainer_step(tr, feeds, 2, &loss)) goto done;
        if (s % 50 == 0 && mw_trainer_eval(tr, feeds, 2, &loss)) goto done;
        if ((s % 500 == 50 || s == 75) &&
            (mw_trainer_save(tr, ckpt, NULL, 0) || mw_trainer_load(tr, ckpt, NULL, 0, NULL)))
            goto done;
        if (s == 99) {
            rss100 = status_kb("VmRSS");
            hwm100 = status_kb("VmHWM");
        }
    }
    long rss = status_kb("VmRSS"), hwm = status_kb("VmHWM");
    double secs = mwb_now() - t0;
    printf("%s, %d steps (%d injected faults, a checkpoint round trip every 500 steps) in %.1f s\n",
           devices, steps, faults, secs);
    printf("peak RSS after 100 steps %ld kB, at the end %ld kB (%+.2f%%); RSS %ld -> %ld kB\n",
           hwm100, hwm, hwm100 > 0 ? 100.0 * (double)(hwm - hwm100) / (double)hwm100 : 0.0, rss100,
           rss);
    mwb_record r = {0};
    mwb_record_str(&r, "case", "soak");
    mwb_record_str(&r, "devices", devices);
    mwb_record_num(&r, "steps", steps);
    mwb_record_num(&r, "faults", faults);
    mwb_record_num(&r, "seconds", secs);
    mwb_record_num(&r, "peak_rss_kb_after_100", (double)hwm100);
    mwb_record_num(&r, "peak_rss_kb_end", (double)hwm);
    mwb_record_num(&r, "peak_rss_growth", hwm100 > 0 ? (double)(hwm - hwm100) / hwm100 : 0.0);
    ctx->emit(ctx, &r);
    rc = 0;
done:
    if (rc) fprintf(stderr, "soak: %s\n", mw_last_error());
    mwb_private_dir_remove(dir, (const char *const[]){"soak.mwc", NULL});
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}
