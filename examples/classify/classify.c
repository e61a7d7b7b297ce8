/* classify: an MLP classifier for any CSV of numeric features with an integer label column.
 *
 * The rows are split (seeded) into a training and a held-out test part; features are
 * standardised with the training part's mean and standard deviation; the MLP (hidden layers of
 * the chosen activation, then a linear layer to the classes) is trained on random batches with
 * the batch sharded over the devices; the whole test part is then predicted in one call of an
 * inference program that reads the trainer's parameters in place. --save writes the weights and
 * the standardisation to a safetensors file that --load reads back (with the same --hidden,
 * --layers and the same columns).
 *
 *   classify examples/classify/wine.csv --devices cpu:2 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "csv_table.h"
#include "meshwit.h"
#include "options.h"

typedef struct options {
    const char *data, *label, *devices, *activation, *optimizer, *save, *load, *predictions;
    int header, hidden, layers, batch, steps, print_every;
    double lr, test_fraction;
    int lr_given; /* else the optimizer's own */
    uint64_t seed;
} options;

#define F(field) offsetof(options, field)

static const cli_option table[] = {
    CLI_OPT("--label", CLI_STRING, F(label), NULL, "NAME",
            "the label column (default: the last one)"),
    CLI_OPT("--header", CLI_CHOICE, F(header), "auto", "yes|no|auto",
            "whether the first row names the columns",
            .choices = CLI_CHOICES({"yes", 1}, {"no", 0}, {"auto", -1})),
    CLI_OPT("--test-fraction", CLI_DOUBLE, F(test_fraction), "0.2", "F",
            "rows held out for the test accuracy", .min = 0, .max = 0.99),
    CLI_OPT("--hidden", CLI_INT, F(hidden), "32", "N", "units per hidden layer", .min = 1,
            .max = 1 << 16),
    CLI_OPT("--layers", CLI_INT, F(layers), "1", "N", "hidden layers; 0: a linear model", .min = 0,
            .max = 64),
    CLI_OPT("--activation", CLI_NAME, F(activation), "relu", "A",
            "relu, tanh, sigmoid, gelu (exact, as nn.GELU()) or gelu_tanh (its tanh "
            "approximation)",
            .choices = CLI_CHOICES({"relu", 0}, {"tanh", 0}, {"sigmoid", 0}, {"gelu", 0},
                                   {"gelu_tanh", 0})),
    CLI_OPT("--optimizer", CLI_NAME, F(optimizer), "adamw", "O",
            "adamw (lr 0.01) or sgd (momentum 0.9, lr 0.05)",
            .choices = CLI_CHOICES({"adamw", 0}, {"sgd", 0})),
    CLI_OPT("--lr", CLI_DOUBLE, F(lr), NULL, "X", "learning rate (default: the optimizer's)",
            .min = 0, .max = 100, .given = F(lr_given)),
    CLI_OPT("--batch", CLI_INT, F(batch), "32", "N", "rows per step", .min = 1, .max = 1 << 24),
    CLI_OPT("--steps", CLI_INT, F(steps), "300", "N",
            "training steps; 0 with --load: only evaluate", .min = 0, .max = 1 << 30),
    CLI_OPT("--print-every", CLI_INT, F(print_every), "50", "N", "loss every N steps", .min = 1,
            .max = 1 << 30),
    CLI_OPT("--devices", CLI_STRING, F(devices), "cpu:1", "SPEC",
            "e.g. cpu:2: the batch is sharded over them"),
    CLI_OPT("--seed", CLI_U64, F(seed), "1", "N", "split, initialisation and batches"),
    CLI_OPT("--save", CLI_STRING, F(save), NULL, "FILE",
            "write the weights and the standardisation (.safetensors)"),
    CLI_OPT("--load", CLI_STRING, F(load), NULL, "FILE", "start from a file written by --save"),
    CLI_OPT("--predictions", CLI_STRING, F(predictions), NULL, "FILE",
            "write the predicted label of every test row, one per line (- for standard output)"),
};

/* The CSV file: the one argument that is no option. */
static int data_file(void *opts, const char *arg) {
    options *o = opts;
    if (o->data || strcmp(arg, "-") == 0) return -1;
    o->data = arg;
    return 0;
}

static const cli_program program = {
    "classify",
    sizeof(options),
    table,
    CLI_COUNT(table),
    "usage: classify FILE.csv [options]\n",
    "Every file is checked before training: the CSV and --load are regular files, the\n"
    "outputs no input and not each other, no FIFO, device or folder, in a folder that\n"
    "takes a new file; each is written beside its name and renamed over it complete.\n"
    "Exit status: 0 done, 1 a library call or an output failed once training started,\n"
    "2 bad arguments, a bad CSV or a file that cannot be used.\n",
    data_file,
};

static int parse(int argc, char **argv, options *o) {
    int rc = cli_parse(&program, argc, argv, o);
    if (rc > 0) cli_usage(&program, stdout);
    if (rc != 0) return rc;
    if (!o->data) {
        fprintf(stderr, "classify: no CSV file given (classify FILE.csv; --help)\n");
        return -1;
    }
    if (!o->lr_given) o->lr = !strcmp(o->optimizer, "sgd") ? 0.05 : 0.01;
    return 0;
}

/* splitmix64 */
static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void shuffle(int64_t *v, int64_t n, uint64_t *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(next(rng) % (uint64_t)(i + 1)), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* The model: x [Batch, Feature] -> layers of activation(W h + b) -> logits [Batch, Class];
 * parameters named as a PyTorch nn.Sequential's state_dict would be, weights [Out, In]. */
typedef struct model {
    mw_graph *g;
    mw_tensor *logits, *pred, *loss;
} model;

static mw_tensor *activate(mw_graph *g, mw_tensor *h, const char *a) {
    return !strcmp(a, "relu")        ? mw_relu(g, h)
           : !strcmp(a, "tanh")      ? mw_tanh(g, h)
           : !strcmp(a, "sigmoid")   ? mw_sigmoid(g, h)
           : !strcmp(a, "gelu_tanh") ? mw_gelu(g, h)
                                     : mw_gelu_erf(g, h);
}

static mw_status build(const options *o, int features, int classes, int batch, int sharded,
                       model *m) {
    mw_status st = mw_graph_new(&m->g);
    if (st) return st;
    mw_graph *g = m->g;
    mw_graph_set_seed(g, o->seed);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", batch}, {"Feature", features}));
    mw_tensor *y = mw_input(g, "y", MW_I32, MW_AXES({"Batch", batch}));
    if (sharded) {
        x = mw_shard(g, x, "Batch", "X");
        y = mw_shard(g, y, "Batch", "X");
    }
    mw_tensor *h = x;
    const char *in = "Feature";
    int64_t in_size = features;
    char axis[2][32], name[64];
    for (int l = 0; l <= o->layers; l++) {
        int last = l == o->layers;
        const char *out = last ? "Class" : axis[l % 2];
        if (!last) snprintf(axis[l % 2], sizeof axis[0], "Hidden%d", l);
        int64_t out_size = last ? classes : o->hidden;
        /* PyTorch's nn.Linear initialisation: U(-1/sqrt(in), 1/sqrt(in)) for both. */
        float bound = 1.0f / sqrtf((float)in_size);
        snprintf(name, sizeof name, "%d.weight", 2 * l);
        mw_tensor *w =
            mw_param(g, name, MW_AXES({out, out_size}, {in, in_size}), MW_INIT_UNIFORM(bound));
        snprintf(name, sizeof name, "%d.bias", 2 * l);
        mw_tensor *b = mw_param(g, name, MW_AXES({out, out_size}), MW_INIT_UNIFORM(bound));
        h = mw_add(g, mw_dot(g, h, w, in), b);
        if (!last) h = activate(g, h, o->activation);
        in = out;
        in_size = out_size;
    }
    m->logits = h;
    m->pred = mw_argmax(g, h, "Class");
    m->loss = mw_mean(g, mw_cross_entropy(g, h, y, "Class", 0), NULL);
    return mw_graph_status(g);
}

/* The weights plus "feature_mean", "feature_std" and "class_labels", in one safetensors file. */
static mw_status save(mw_trainer *tr, const char *path, const float *mean, const float *sd,
                      const csv_table *t) {
    int n = mw_trainer_param_count(tr);
    mw_safetensors_entry *e = calloc((size_t)n + 3, sizeof *e);
    float *labels = malloc((size_t)t->nclasses * sizeof *labels);
    mw_status st = e && labels ? MW_OK : MW_ERR_NOMEM;
    for (int i = 0; i < n && st == MW_OK; i++) {
        mw_param_info p;
        if ((st = mw_trainer_param_info(tr, i, &p))) break;
        float *d = malloc((size_t)p.count * sizeof *d);
        if (!d) {
            st = MW_ERR_NOMEM;
            break;
        }
        e[i] = (mw_safetensors_entry){.name = p.name, .rank = p.rank, .data = d};
        for (int k = 0; k < p.rank; k++) e[i].shape[k] = p.axis[k].size;
        st = mw_trainer_read_param(tr, p.name, d, p.count);
    }
    for (int k = 0; labels && k < t->nclasses; k++) labels[k] = (float)t->classes[k];
    e[n] = (mw_safetensors_entry){"feature_mean", 1, {t->features}, mean};
    e[n + 1] = (mw_safetensors_entry){"feature_std", 1, {t->features}, sd};
    e[n + 2] = (mw_safetensors_entry){"class_labels", 1, {t->nclasses}, labels};
    if (st == MW_OK) st = mw_safetensors_write(path, e, n + 3);
    for (int i = 0; e && i < n; i++) free((void *)e[i].data);
    free(e);
    free(labels);
    return st;
}

/* The class labels a --load file was trained on ("class_labels"), into *out (malloc'ed). */
static mw_status load_classes(const char *path, int32_t **out, int *n) {
    mw_safetensors *f;
    mw_stored_tensor t;
    *out = NULL;
    mw_status st = mw_safetensors_open(path, &f);
    if (st == MW_OK && (st = mw_safetensors_find(f, "class_labels", &t)) == MW_OK &&
        (t.rank != 1 || t.count < 1 || t.count > (1 << 20)))
        st = MW_ERR_FORMAT;
    float *v = st == MW_OK ? malloc((size_t)t.count * sizeof *v) : NULL;
    *out = v ? malloc((size_t)t.count * sizeof **out) : NULL;
    if (st == MW_OK && (!v || !*out)) st = MW_ERR_NOMEM;
    if (st == MW_OK) st = mw_safetensors_read(f, "class_labels", v, t.count);
    for (int64_t i = 0; st == MW_OK && i < t.count; i++) {
        if (v[i] != floorf(v[i]) || fabsf(v[i]) > 16777216.0f) st = MW_ERR_FORMAT;
        (*out)[i] = (int32_t)v[i];
    }
    free(v);
    mw_safetensors_close(f);
    if (st != MW_OK) {
        free(*out);
        *out = NULL;
        return st;
    }
    *n = (int)t.count;
    return MW_OK;
}

static mw_status load_stats(const char *path, float *mean, float *sd, int features) {
    mw_safetensors *f;
    mw_status st = mw_safetensors_open(path, &f);
    if (st == MW_OK && (st = mw_safetensors_read(f, "feature_mean", mean, features)) == MW_OK)
        st = mw_safetensors_read(f, "feature_std", sd, features);
    mw_safetensors_close(f);
    return st;
}

/* The predicted labels, one per line ("-": standard output), written beside path and synced to
 * the disk; mw_output_commit renames the file over path once --save is written too, so that a
 * failure of either (a full disk) leaves both as they were. 0 and *out, or -1 reported. */
static int write_predictions(const char *path, const float *pred, int64_t n, const csv_table *t,
                             mw_output **out) {
    mw_status st = mw_output_open(path, "--predictions", MW_FILE_STDIO, out);
    for (int64_t i = 0; st == MW_OK && i < n; i++)
        st = mw_output_printf(*out, "%d\n", t->classes[(int)pred[i]]);
    if (st == MW_OK) st = mw_output_sync(*out);
    if (st == MW_OK) return 0;
    mw_output_abandon(*out);
    *out = NULL;
    fprintf(stderr, "classify: %s\n", mw_last_error());
    return -1;
}

/* The most bytes --save takes: the weights, feature_mean, feature_std and class_labels in F32,
 * and a safetensors header of at most 256 bytes a tensor (names of a few bytes, rank 1 or 2). */
static int64_t save_bytes(const options *o, int features, int classes) {
    int64_t values = 2 * (int64_t)features + classes, in = features;
    for (int l = 0; l <= o->layers; l++) {
        int64_t out = l == o->layers ? classes : o->hidden;
        values += in * out + out;
        in = out;
    }
    return 64 + 256 * (2 * ((int64_t)o->layers + 1) + 3) + 4 * values;
}

#define PREDICTION_BYTES 12 /* a line of --predictions: "-2147483648\n" at most */

/* Every file of the run (meshwit/file.h): the CSV and --load are inputs, --save and
 * --predictions outputs (no input, not each other, no FIFO, device, folder or read-only file, in
 * a folder that takes a new file), with room for save and pred bytes (0: not known yet). 0, or
 * -1 reported. */
static int check_files(const options *o, int64_t save, int64_t pred) {
    mw_file_set *fs;
    mw_status st = mw_file_set_new(&fs);
    if (!st) st = mw_file_set_add_input(fs, o->data, "the CSV", 0);
    if (!st && o->load) st = mw_file_set_add_input(fs, o->load, "--load", 0);
    if (!st && o->save) st = mw_file_set_add_output(fs, o->save, "--save", 0, save);
    if (!st && o->predictions)
        st = mw_file_set_add_output(fs, o->predictions, "--predictions", MW_FILE_STDIO, pred);
    mw_file_set_free(fs);
    if (!st) return 0;
    fprintf(stderr, "classify: %s\n", mw_last_error());
    return -1;
}

static int fail(mw_status st, const char *what) {
    fprintf(stderr, "classify: %s: %s [%s]: %s\n", what, mw_strerror(st), mw_status_name(st),
            mw_last_error());
    return 1;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    /* Every file is checked before anything is read, and again with the outputs' sizes once
     * the CSV gives them. */
    if (check_files(&o, 0, 0)) return 2;
    /* A loaded model's classes are the labels it was trained on: the CSV's must be among them. */
    int32_t *known = NULL;
    int nknown = 0;
    mw_status st;
    if (o.load && (st = load_classes(o.load, &known, &nknown)) != MW_OK) {
        fprintf(stderr, "classify: %s: no usable class_labels (a file written by --save?): %s\n",
                o.load, st == MW_ERR_FORMAT ? "not a list of integer labels" : mw_last_error());
        return 2;
    }
    csv_table t;
    char err[512];
    int bad_csv = csv_table_load(o.data, o.label, o.header, known, nknown, &t, err, sizeof err);
    free(known);
    if (bad_csv) {
        fprintf(stderr, "classify: %s\n", err);
        return 2;
    }
    /* The split: a seeded shuffle, the first part held out. */
    int64_t *order = malloc((size_t)t.rows * sizeof *order);
    float *mean = calloc((size_t)t.features, sizeof *mean), *sd = calloc((size_t)t.features, 4);
    if (!order || !mean || !sd) return fail(MW_ERR_NOMEM, "setup");
    uint64_t rng = o.seed;
    for (int64_t i = 0; i < t.rows; i++) order[i] = i;
    shuffle(order, t.rows, &rng);
    int64_t ntest = (int64_t)llround(o.test_fraction * (double)t.rows);
    if (o.test_fraction > 0 && ntest < 1) ntest = 1;
    int64_t ntrain = t.rows - ntest, *test = order, *train = order + ntest;
    if (ntrain < 1) {
        fprintf(stderr, "classify: %s: %lld rows leave none to train on\n", o.data,
                (long long)t.rows);
        return 2;
    }
    if (check_files(&o, save_bytes(&o, t.features, t.nclasses), PREDICTION_BYTES * ntest)) return 2;
    printf("%s: %lld rows, %d features, %d classes (label '%s'); train %lld, test %lld\n", o.data,
           (long long)t.rows, t.features, t.nclasses, t.names[t.features], (long long)ntrain,
           (long long)ntest);
    /* Standardisation with the training part's statistics (population standard deviation). */
    for (int f = 0; f < t.features; f++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < ntrain; i++) s += t.x[train[i] * t.features + f];
        double mu = s / (double)ntrain;
        for (int64_t i = 0; i < ntrain; i++) {
            double d = t.x[train[i] * t.features + f] - mu;
            s2 += d * d;
        }
        double v = sqrt(s2 / (double)ntrain);
        mean[f] = (float)mu;
        sd[f] = v > 0 ? (float)v : 1.0f;
    }
    if (o.load && (st = load_stats(o.load, mean, sd, t.features)) != MW_OK)
        return fail(st, "cannot load the standardisation");
    for (int64_t i = 0; i < t.rows; i++)
        for (int f = 0; f < t.features; f++)
            t.x[i * t.features + f] = (t.x[i * t.features + f] - mean[f]) / sd[f];

    mw_mesh *mesh;
    if ((st = mw_mesh_new(o.devices, "X", &mesh)) != MW_OK) return fail(st, "cannot make the mesh");
    int batch = o.batch < ntrain ? o.batch : (int)ntrain;
    if (batch < mw_mesh_size(mesh)) batch = mw_mesh_size(mesh);
    model m = {0};
    mw_trainer *tr = NULL;
    mw_infer *inf = NULL;
    mw_output *pred_out = NULL; /* --predictions, written, renamed after --save */
    int sgd = !strcmp(o.optimizer, "sgd");
    mw_trainer_config cfg = {.optimizer = mw_optimizer_defaults(sgd ? MW_SGD : MW_ADAMW)};
    cfg.optimizer.lr = (float)o.lr;
    if (sgd) cfg.optimizer.momentum = 0.9f;
    if ((st = build(&o, t.features, t.nclasses, batch, mw_mesh_size(mesh) > 1, &m)) != MW_OK ||
        (st = mw_trainer_new(m.g, m.loss, mesh, &cfg, &tr)) != MW_OK) {
        rc = fail(st, "cannot build the model");
        goto done;
    }
    printf("MLP %d -> %d x %d %s -> %d, %s lr %g, batch %d on %s\n", t.features, o.layers, o.hidden,
           o.activation, t.nclasses, o.optimizer, o.lr, batch, mw_mesh_describe(mesh));
    if (o.load && (st = mw_trainer_load_weights(tr, o.load, NULL, 0)) != MW_OK) {
        rc = fail(st, "cannot load the weights");
        goto done;
    }

    float *bx = malloc((size_t)batch * (size_t)t.features * sizeof *bx);
    int32_t *by = malloc((size_t)batch * sizeof *by);
    if (!bx || !by) {
        rc = fail(MW_ERR_NOMEM, "setup");
        goto done_batch;
    }
    mw_feed feeds[2] = {{"x", bx, (int64_t)batch * t.features}, {"y", by, batch}};
    int64_t pos = ntrain; /* epochs of a reshuffled training part */
    for (int s = 0; s < o.steps; s++) {
        for (int r = 0; r < batch; r++) {
            if (pos == ntrain) {
                shuffle(train, ntrain, &rng);
                pos = 0;
            }
            int64_t row = train[pos++];
            memcpy(bx + (size_t)r * t.features, t.x + row * t.features, (size_t)t.features * 4);
            by[r] = t.y[row];
        }
        float loss;
        if ((st = mw_trainer_step(tr, feeds, 2, &loss)) != MW_OK) {
            rc = fail(st, "training failed");
            goto done_batch;
        }
        if ((s + 1) % o.print_every == 0 || s + 1 == o.steps)
            printf("step %d: loss %.6f\n", s + 1, loss);
    }

    if (ntest > 0) { /* the whole test part in one call, through an inference program */
        float *tx = malloc((size_t)ntest * (size_t)t.features * sizeof *tx);
        float *pred = malloc((size_t)ntest * sizeof *pred);
        mw_infer_config ic = {.outputs = &m.pred, .noutputs = 1};
        st = tx && pred ? MW_OK : MW_ERR_NOMEM;
        for (int64_t i = 0; st == MW_OK && i < ntest; i++)
            memcpy(tx + i * t.features, t.x + test[i] * t.features, (size_t)t.features * 4);
        if (st == MW_OK) st = mw_infer_from_trainer(tr, m.g, &ic, &inf);
        mw_feed in = {"x", tx, ntest * t.features};
        mw_fetch out = {m.pred, pred, ntest};
        if (st == MW_OK) st = mw_infer_run(inf, &in, 1, ntest, &out, 1);
        if (st == MW_OK) {
            int64_t correct = 0;
            for (int64_t i = 0; i < ntest; i++) correct += (int32_t)pred[i] == t.y[test[i]];
            printf("test accuracy %.6f (%lld/%lld)\n", (double)correct / (double)ntest,
                   (long long)correct, (long long)ntest);
            if (o.predictions && write_predictions(o.predictions, pred, ntest, &t, &pred_out))
                rc = 1;
        } else {
            rc = fail(st, "prediction failed");
        }
        free(tx);
        free(pred);
    }
    if (rc == 0 && o.save) {
        if ((st = save(tr, o.save, mean, sd, &t)) != MW_OK)
            rc = fail(st, "cannot save");
        else
            printf("saved %s\n", o.save);
    }
    if (rc == 0 && pred_out && mw_output_commit(pred_out) != MW_OK) {
        fprintf(stderr, "classify: %s\n", mw_last_error());
        rc = 1;
    } else if (rc != 0) {
        mw_output_abandon(pred_out);
    }
    pred_out = NULL;
done_batch:
    free(bx);
    free(by);
done:
    mw_infer_free(inf);
    mw_trainer_free(tr);
    mw_graph_free(m.g);
    mw_mesh_free(mesh);
    csv_table_free(&t);
    free(order);
    free(mean);
    free(sd);
    return rc;
}
