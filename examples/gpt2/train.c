/* The gpt2 program's training: the model and its trainer, the loop of steps with its checkpoints
 * and validation, and what an interruption leaves. */
#include <math.h>
#include <stdio.h>

#include "gpt2.h"

/* Builds the model for one micro-batch (--batch / --micro-batches rows) x --seq over `mesh`,
 * sharded along Batch over the data axis and, with --model-axis, split over the model axis, and
 * its trainer (accumulating gradients when there are several micro-batches). */
mw_status build(const options *o, mw_mesh *mesh, mw_graph **g, gpt2_graph *m, mw_trainer **tr) {
    mw_status st = mw_graph_new(g);
    if (st != MW_OK) return st;
    mw_graph_set_seed(*g, o->seed);
    const char *data = o->data_axis[0] ? o->data_axis : NULL;
    st = model_build(o, *g,
                     &(gpt2_layout){.batch = o->batch / o->micro_batches,
                                    .seq = o->seq,
                                    .data_axis = data,
                                    .model_axis = o->model_axis,
                                    .fsdp_axis = o->shard_params ? data : NULL},
                     m);
    if (st != MW_OK) return st;
    mw_trainer_config cfg = {
        .optimizer = {.kind = MW_ADAMW,
                      .lr = (float)o->lr,
                      .beta1 = (float)o->beta1,
                      .beta2 = (float)o->beta2,
                      .eps = (float)o->eps,
                      .weight_decay = (float)o->weight_decay,
                      .grad_clip = (float)o->grad_clip,
                      .warmup_steps = o->warmup,
                      .decay_steps = o->cosine ? o->steps : 0,
                      .min_lr_ratio = (float)o->min_lr_ratio},
        .nonfinite = o->skip_nonfinite ? MW_NONFINITE_SKIP : MW_NONFINITE_STOP,
        .check_replicas_every = o->check_replicas,
        .shard_optimizer = o->shard_optimizer,
        .grad_accumulation = o->micro_batches > 1 && !o->pipeline_axis,
        .pipeline_axis = o->pipeline_axis,
        .micro_batches = o->pipeline_axis ? o->micro_batches : 0,
        .pipeline_schedule =
            o->pipeline_axis ? (mw_pipeline_schedule)o->pipeline_schedule : MW_SCHEDULE_GPIPE,
        .virtual_stages = o->pipeline_axis && o->pipeline_schedule == MW_SCHEDULE_INTERLEAVED
                              ? o->virtual_stages
                              : 0,
        .cpu_threads = o->cpu_threads,
        .precision = o->bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32,
        .recompute = (mw_recompute)o->recompute,
        .keep_gathered = o->keep_gathered,
        .gathers = o->serial_gathers ? MW_GATHERS_AT_USE : MW_GATHERS_AHEAD};
    return mw_trainer_new(*g, m->loss, mesh, &cfg, tr);
}

/* The host batch r->batch (the global one) through the trainer, micro-batch by micro-batch:
 * micro-batch k is rows [k B/M, (k + 1) B/M) of it, so the rows seen are the global batch's in
 * its order. eval: the loss only; else micro-batches 0..M-2 accumulate gradients and the last
 * one steps (the update with the mean of all M gradients, summed in this order: trainer.h). The
 * loss is the mean of the micro-batches' losses (each the mean over its rows): the global
 * batch's. With M = 1 it is one eval or step of the whole batch. On failure *micro says which. */
static mw_status run_batch(run *r, int eval, float *loss, int *micro) {
    const int m = r->o.micro_batches;
    const int64_t n = (int64_t)(r->o.batch / m) * r->o.seq; /* tokens of a micro-batch */
    mw_feed feeds[2];
    gpt2_batch_feeds(&r->batch, feeds);
    /* A pipeline takes the micro-batches of the step at once, in the same order. */
    if (r->o.pipeline_axis) {
        *micro = 0;
        return eval ? mw_trainer_eval(r->tr, feeds, 2, loss)
                    : mw_trainer_step(r->tr, feeds, 2, loss);
    }
    double sum = 0.0;
    for (int k = 0; k < m; k++) {
        mw_feed f[2] = {{feeds[0].name, r->batch.tokens + k * n, n},
                        {feeds[1].name, r->batch.targets + k * n, n}};
        float l;
        mw_status st = eval        ? mw_trainer_eval(r->tr, f, 2, &l)
                       : k < m - 1 ? mw_trainer_accumulate(r->tr, f, 2, &l)
                                   : mw_trainer_step(r->tr, f, 2, &l);
        if (st != MW_OK) {
            *micro = k;
            return st;
        }
        sum += l;
    }
    *loss = (float)(sum / m);
    return MW_OK;
}

/* Mean loss over the first n sequential batches of t (fewer when t holds fewer). */
mw_status evaluate(run *r, const gpt2_tokens *t, int n, float *loss, int *used) {
    int64_t avail = gpt2_batch_count(t, r->o.batch, r->o.seq);
    if (n > avail) n = (int)avail;
    double sum = 0.0;
    for (int k = 0; k < n; k++) {
        float l;
        int micro;
        gpt2_batch_sequential(&r->batch, t, k);
        mw_status st = run_batch(r, 1, &l, &micro);
        if (st != MW_OK) return st;
        sum += l;
    }
    *loss = (float)(sum / n);
    if (used) *used = n;
    return MW_OK;
}

/* After a stop request: the step in flight has finished; saves the checkpoint when one is
 * configured. Returns 130 (SIGINT) or 143 (SIGTERM), or 2 when the save fails. */
static int interrupted(run *r) {
    long long at = (long long)mw_trainer_steps(r->tr);
    if (r->o.checkpoint) {
        mw_status st = save_checkpoint(r);
        if (st != MW_OK) return fail(st, "interrupted, and cannot write the checkpoint");
        printf("interrupted at step %lld; resume with --resume\n", at);
    } else {
        printf("interrupted at step %lld (no --checkpoint: nothing saved)\n", at);
    }
    fflush(stdout);
    return cli_stop_status();
}

/* Under mpirun a Ctrl-C leaves each process cli_mpirun_grace() seconds between SIGTERM and
 * SIGKILL: said once when a step and a checkpoint take longer, with the flag that gives them
 * the time (else the steps since the last checkpoint are lost). */
static void note_grace(double step_and_save_ms) {
    static int said;
    double grace = cli_mpirun_grace();
    if (said || grace < 0 || step_and_save_ms <= 1e3 * grace) return;
    said = 1;
    printf("note: under mpirun, Ctrl-C leaves each process %g s after its SIGTERM to finish the "
           "step and write the checkpoint, and they take %.1f s here: start mpirun with --mca "
           "odls_base_sigkill_timeout %d to keep the steps since the last checkpoint\n",
           grace, step_and_save_ms / 1e3, (int)ceil(2.0 * step_and_save_ms / 1e3) + 1);
}

/* Steps from where the trainer stands to --steps (or --stop-at): a batch, a step, its loss, the
 * checkpoint and the validation loss at their intervals. 0, or the exit status. */
int train(run *r) {
    const options *o = &r->o;
    float loss = NAN, val;
    for (int s = (int)mw_trainer_steps(r->tr); s < o->steps; s++) {
        double t0 = now();
        gpt2_rng before = r->rng; /* an interrupted step leaves the data stream where it was */
        if (o->sequential)
            gpt2_batch_sequential(&r->batch, &r->train, s);
        else
            gpt2_batch_random(&r->batch, &r->train, &r->rng);
        int64_t skipped = mw_trainer_skipped_steps(r->tr);
        int micro = 0;
        /* A stop request is seen by the step, after the micro-batches that accumulate (on every
         * process at the same step): their gradients are dropped with the process. */
        mw_status st = run_batch(r, 0, &loss, &micro);
        if (st == MW_ERR_INTERRUPTED) {
            r->rng = before;
            return interrupted(r);
        }
        if (st != MW_OK && o->micro_batches > 1) {
            char what[96];
            snprintf(what, sizeof what, "training step failed (micro-batch %d of %d)", micro + 1,
                     o->micro_batches);
            return fail(st, what);
        }
        if (st != MW_OK) return fail(st, "training step failed");
        double ms = 1e3 * (now() - t0);
        printf("step %d: loss %.4f  (%.1f ms/step, %.0f tokens/s)\n", s + 1, loss, ms,
               (double)o->batch * o->seq / (ms * 1e-3));
        if (mw_trainer_skipped_steps(r->tr) > skipped)
            printf("step %d skipped: non-finite loss or gradients, nothing updated (%lld "
                   "skipped so far)\n",
                   s + 1, (long long)mw_trainer_skipped_steps(r->tr));
        fflush(stdout);
        if (!isfinite(loss) && !o->skip_nonfinite) {
            perr("the loss is %f at step %d; try a lower --lr\n", loss, s + 1);
            return 2;
        }
        int stop = o->stop_at > 0 && s + 1 == o->stop_at;
        if (o->checkpoint && ((s + 1) % o->checkpoint_every == 0 || s + 1 == o->steps || stop)) {
            double t1 = now();
            if ((st = save_checkpoint(r)) != MW_OK) return fail(st, "cannot write the checkpoint");
            note_grace(ms + 1e3 * (now() - t1));
        }
        if (o->val_every > 0 && ((s + 1) % o->val_every == 0 || s + 1 == o->steps)) {
            st = evaluate(r, &r->val, o->val_batches, &val, NULL);
            if (st != MW_OK) return fail(st, "validation failed");
            printf("val loss %.4f  (after step %d)\n", val, s + 1);
            fflush(stdout);
        }
        if (stop) {
            printf("stopped after step %d (--stop-at)\n", s + 1);
            return 0;
        }
    }
    if (o->steps > 0) printf("final loss %.4f\n", loss);
    if (mw_trainer_skipped_steps(r->tr) > 0)
        printf("%lld steps skipped for non-finite values\n",
               (long long)mw_trainer_skipped_steps(r->tr));
    return 0;
}
