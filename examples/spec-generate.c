/*
 * spec-generate: speculative decoding through the public C API alone.
 *
 *   spec-generate TARGET.gguf DRAFT.gguf|- N_TOKENS TOKEN [TOKEN ...]
 *
 * Loads a target and (unless "-") a DFlash/DSpark draft, generates up to N_TOKENS tokens after the
 * prompt token ids greedily, and prints the generated ids on one line, then the statistics.
 */
#include "dspark.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char * what) {
    fprintf(stderr, "spec-generate: %s: %s\n", what, dspark_last_error());
    return 1;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TARGET.gguf DRAFT.gguf|- N_TOKENS TOKEN [TOKEN ...]\n", argv[0]);
        return 2;
    }
    const int n_prompt = argc - 4;
    dspark_token * prompt = malloc(sizeof(dspark_token) * n_prompt);
    for (int i = 0; i < n_prompt; ++i) {
        prompt[i] = (dspark_token) atoi(argv[4 + i]);
    }
    /* every handle starts NULL and is freed at `done` (the free functions take NULL), so the
     * error paths release what was made too: the example runs clean under LeakSanitizer */
    struct dspark_model * target = NULL, * draft = NULL;
    struct dspark_context * ctx = NULL;
    struct dspark_draft_context * dctx = NULL;
    struct dspark_engine * engine = NULL;
    int rc = 0;

    if (!(target = dspark_model_load_from_file(argv[1], NULL))) {
        rc = fail("loading the target");
        goto done;
    }
    if (strcmp(argv[2], "-") != 0 && !(draft = dspark_draft_load_from_file(argv[2], target, NULL))) {
        rc = fail("loading the draft");
        goto done;
    }

    struct dspark_context_params cp = dspark_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    ctx = dspark_context_init(target, &cp);
    dctx = draft ? dspark_draft_context_init(draft, &cp) : NULL;
    if (!ctx || (draft && !dctx)) {
        rc = fail("creating the contexts");
        goto done;
    }
    struct dspark_spec_params sp = dspark_spec_default_params();
    if (!(engine = dspark_engine_init(ctx, dctx, &sp))) {
        rc = fail("creating the engine");
        goto done;
    }

    struct dspark_request req = {0};
    req.prompt = prompt;
    req.n_prompt = n_prompt;
    req.max_tokens = atoi(argv[3]);
    if (dspark_engine_add(engine, 0, &req) != DSPARK_STATUS_OK) {
        rc = fail("prefill");
        goto done;
    }
    for (;;) {
        const dspark_token * toks;
        const int32_t n = dspark_engine_get_tokens(engine, 0, &toks, NULL);
        for (int32_t i = 0; i < n; ++i) {
            printf("%d ", toks[i]);
        }
        if (dspark_engine_seq_status(engine, 0) != DSPARK_SEQ_ACTIVE) {
            break;
        }
        if (dspark_engine_step(engine) < 0) {
            rc = fail("step");
            goto done;
        }
    }
    printf("\n");

    struct dspark_spec_stats st;
    dspark_engine_get_stats(engine, -1, &st);
    const double tau = st.n_steps ? (double) (st.n_accepted + st.n_steps) / st.n_steps : 0.0;
    printf("generated %d, steps %d, drafted %d, accepted %d, tau %.2f\n", st.n_generated, st.n_steps, st.n_drafted,
           st.n_accepted, tau);

done:
    dspark_engine_free(engine);
    dspark_draft_context_free(dctx);
    dspark_context_free(ctx);
    dspark_model_free(draft);
    dspark_model_free(target);
    free(prompt);
    return rc;
}
