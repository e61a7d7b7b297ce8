/* The command-line helpers the examples share (examples/common/cli.c): a run's identity, which a
 * checkpoint keeps so that a resume can name every setting that differs. */
#include <criterion/criterion.h>

#include <signal.h>
#include <string.h>

#include "cli.h"

Test(cli, an_identity_lists_and_compares_its_settings) {
    cli_identity id = {0};
    cli_identity_add(&id, "lr", "%g", 0.002);
    cli_identity_add(&id, "steps", "%d", 600);
    cr_assert_str_eq(id.text, "lr 0.002\nsteps 600\n");
    char report[256] = "";
    cr_assert_eq(cli_identity_compare("lr 0.002\nsteps 600\n", id.text, "", report, sizeof report),
                 0);
    cr_assert_eq(cli_identity_compare("lr 0.001\nsteps 600\n", id.text, "", report, sizeof report),
                 1);
    cr_assert(strstr(report, "lr: 0.001 in the checkpoint, 0.002 now"), "%s", report);
    cr_assert_eq(
        cli_identity_compare("lr 0.001\nsteps 600\n", id.text, "lr", report, sizeof report), 0,
        "an allowed change is no difference");
}

/* A setting that does not fit would be left out of every comparison: the program ends instead,
 * saying so (a bug of the program, whose settings are a fixed list of short values). */
Test(cli, an_identity_that_overflows_ends_the_program, .signal = SIGABRT) {
    static cli_identity id;
    char value[200];
    memset(value, 'x', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    for (int i = 0; i < 100; i++) cli_identity_add(&id, "setting", "%s", value);
}
