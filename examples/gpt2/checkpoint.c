/* The gpt2 program's checkpoints: the run's identity (the settings that make it what it is, from
 * the option table), the program's part of a checkpoint beside the trainer's state, what a
 * --checkpoint FILE may hold before a run starts, resuming, and the flags every process of a job
 * must share. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "gpt2.h"

/* The example's own part of a checkpoint: where the data stream stands (the batches' random
 * windows; the sample draws from a sampler of its own, seeded by --seed, so a resumed run samples
 * what the uninterrupted one does), and the run it belongs to (its settings, as run_identity
 * writes them). */
typedef struct resume_state {
    uint64_t magic; /* RESUME_MAGIC_RUN; RESUME_MAGIC: an older state, without the identity */
    uint64_t rng;
    int64_t step;
    char identity[sizeof((cli_identity *)0)->text];
} resume_state;

#define RESUME_MAGIC 0x6770743272657375ull     /* "gpt2resu" */
#define RESUME_MAGIC_RUN 0x6770743272756e31ull /* "gpt2run1" */
#define RESUME_OLD_BYTES offsetof(resume_state, identity)

/* Under mpirun every process calls it: the save is collective (ZeRO-1 gathers the other
 * processes' moments), and every process writes the file it resumes from (on a shared file
 * system the writers' temporary files differ and each rename leaves one complete state). */
mw_status save_checkpoint(run *r) {
    static resume_state rs; /* 3 KB: not on the stack of every save */
    memset(&rs, 0, sizeof rs);
    rs = (resume_state){RESUME_MAGIC_RUN, r->rng.state, mw_trainer_steps(r->tr), {0}};
    memcpy(rs.identity, r->identity.text, r->identity.len + 1);
    return mw_trainer_save(r->tr, r->o.checkpoint, &rs, sizeof rs);
}

/* The settings that make the run what it is, as a checkpoint records them: a resumed run must
 * have the same (else it would continue another run from this one's state) unless
 * --allow-change names them. The model's sizes as chosen (the preset's, the file's or the flags'),
 * the data as its training tokens (count and hash, so the same tokens under another name are the
 * same data), then every flag the option table marks CLI_RUN. */
void run_identity(run *r) {
    const gpt2_config *c = &r->o.model;
    cli_identity *id = &r->identity;
    memset(id, 0, sizeof *id);
    cli_identity_add(id, "layers", "%d", c->layers);
    cli_identity_add(id, "heads", "%d", c->heads);
    cli_identity_add(id, "channels", "%d", c->channels);
    cli_identity_add(id, "context", "%d", c->max_seq);
    cli_identity_add(id, "vocab", "%d", c->vocab);
    cli_identity_add(id, "padded-vocab", "%d", c->padded_vocab);
    if (r->o.family == FAMILY_LLAMA) {
        const llama_config *l = &r->o.llama;
        cli_identity_add(id, "llama",
                         "family %d, kv heads %d, head size %d, MLP %d, eps %.9g, "
                         "tied %d, qkv bias %d, rope %.9g/%d/%.9g/%.9g/%.9g/%lld",
                         (int)l->family, l->kv_heads, l->head_dim, l->hidden, (double)l->rms_eps,
                         l->tied, l->qkv_bias, (double)l->rope.theta, (int)l->rope.scaling,
                         (double)l->rope.factor, (double)l->rope.low_freq_factor,
                         (double)l->rope.high_freq_factor,
                         (long long)l->rope.original_max_positions);
    }
    cli_identity_add(id, "data", "%lld tokens, hash %016llx", (long long)r->train.count,
                     (unsigned long long)cli_hash(0, r->train.ids,
                                                  (size_t)r->train.count * sizeof *r->train.ids));
    gpt2_args_identity(&r->o, id);
}

/* What --checkpoint FILE holds, before anything is built: with --resume, a state of this
 * program whose run is this one (each setting that differs is named with both values, unless
 * --allow-change names it); without it, nothing, unless --start-over allows a new run to
 * replace it. 0, or the exit status (reported). */
int check_checkpoint(const run *r) {
    const options *o = &r->o;
    static resume_state rs;
    size_t n = 0;
    int64_t step = 0;
    char names[512], bad[64];
    cli_identity_names(r->identity.text, names, sizeof names);
    if (o->allow_change &&
        cli_identity_check_names(r->identity.text, o->allow_change, bad, sizeof bad) != 0) {
        perr("--allow-change %s: '%s' is not a setting a checkpoint records (%s)\n",
             o->allow_change, bad, names);
        return 2;
    }
    if (!o->resume) {
        struct stat sb;
        if (o->start_over || stat(o->checkpoint, &sb) != 0) return 0;
        if (mw_checkpoint_info(o->checkpoint, &step, &rs, sizeof rs, &n) == MW_OK)
            perr("--checkpoint %s holds a run at step %lld: continue it with --resume, "
                 "or give --start-over to replace it with a new run\n",
                 o->checkpoint, (long long)step);
        else
            perr("--checkpoint %s exists and holds no run (%s): not replaced; name "
                 "another file, or give --start-over to replace it\n",
                 o->checkpoint, mw_last_error());
        return 2;
    }
    mw_status st = mw_checkpoint_info(o->checkpoint, &step, &rs, sizeof rs, &n);
    if (st != MW_OK) return fail(st, "cannot resume");
    if (n == RESUME_OLD_BYTES && rs.magic == RESUME_MAGIC) {
        printf("%s records no settings (an older checkpoint): resuming without comparing them\n",
               o->checkpoint);
        return 0;
    }
    if (n != sizeof rs || rs.magic != RESUME_MAGIC_RUN) {
        perr("%s was not written by this program\n", o->checkpoint);
        return 2;
    }
    if (o->eval_only) return 0; /* evaluating the state: how it was trained does not matter */
    rs.identity[sizeof rs.identity - 1] = '\0';
    char report[2048];
    int differ =
        cli_identity_compare(rs.identity, r->identity.text, o->allow_change ? o->allow_change : "",
                             report, sizeof report);
    if (differ == 0) return 0;
    perr("--resume: %s holds another run (at step %lld); %d setting%s differ%s:\n%s\n"
         "  give the checkpoint's settings, allow a change by name (--allow-change "
         "lr,steps), or start a new run (--start-over, without --resume)\n",
         o->checkpoint, (long long)step, differ, differ > 1 ? "s" : "", differ > 1 ? "" : "s",
         report);
    return 2;
}

/* With --resume: the trainer's state and the program's from --checkpoint FILE. *finished when
 * the run is already at --steps (said; nothing more to do). 0, or the exit status (reported). */
int resume(run *r, int *finished) {
    const options *o = &r->o;
    resume_state rs;
    size_t n = 0;
    mw_status st = mw_trainer_load(r->tr, o->checkpoint, &rs, sizeof rs, &n);
    if (st != MW_OK) return fail(st, "cannot resume");
    if (!(n == sizeof rs && rs.magic == RESUME_MAGIC_RUN) &&
        !(n == RESUME_OLD_BYTES && rs.magic == RESUME_MAGIC)) {
        perr("%s was not written by this program\n", o->checkpoint);
        return 2;
    }
    r->rng.state = rs.rng;
    if (!o->eval_only && rs.step >= o->steps) {
        printf("already at step %lld of %d\n", (long long)rs.step, o->steps);
        *finished = 1;
        return 0;
    }
    printf("resumed %s at step %lld\n", o->checkpoint, (long long)rs.step);
    return 0;
}

/* Every process of an MPI job must train the same model on the same data: compares the model,
 * the data itself and every flag but the local ones (--devices, --cpu-threads, ...: the option
 * table's CLI_LOCAL) with the other processes. */
mw_status agree_flags(const run *r) {
    if (mw_distributed_size() <= 1) return MW_OK;
    const gpt2_config *c = &r->o.model;
    uint64_t data = cli_hash(0, r->data.ids, (size_t)r->data.count * sizeof *r->data.ids);
    uint64_t val = cli_hash(0, r->val_file.ids, (size_t)r->val_file.count * sizeof(uint16_t));
    char text[4096];
    snprintf(text, sizeof text,
             "model: %d layers, %d heads, %d channels, context %d, vocab %d/%d\n"
             "--data: %lld tokens, hash %016llx\n--val-data: %lld tokens, hash %016llx\n"
             "--tokenizer: %d tokens\nllama: %d kv heads, %d head size, %d MLP\n",
             c->layers, c->heads, c->channels, c->max_seq, c->vocab, c->padded_vocab,
             (long long)r->data.count, (unsigned long long)data, (long long)r->val_file.count,
             (unsigned long long)val, r->o.tok_vocab, r->o.llama.kv_heads, r->o.llama.head_dim,
             r->o.llama.hidden);
    gpt2_args_text(&r->o, text, sizeof text);
    return mw_distributed_agree("gpt2 flags", text, 0);
}
