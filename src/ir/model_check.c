/* model_check.c — a model file loaded as the rest of memplan needs it: read by the model
 * readers (model/model.h: mp_model_read_*), then checked as a program (mp_program_check:
 * every layer takes what the one before gives).  See layers.h.
 */
#include "layers.h"

/* Keeps m on success; releases it when the program check fails (the reader already did on
 * its own errors). */
static enum mp_status checked(struct mp_model *m, enum mp_status st, struct mp_diag *d)
{
    if (st != MP_OK)
        return st;
    st = mp_program_check(m, d);
    if (st != MP_OK)
        mp_model_release(m);
    return st;
}

enum mp_status mp_model_load_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                    struct mp_diag *d)
{
    return checked(m, mp_model_read_string(m, text, len, path, d), d);
}

enum mp_status mp_model_load_file(struct mp_model *m, const char *path, struct mp_diag *d)
{
    return checked(m, mp_model_read_file(m, path, d), d);
}

enum mp_status mp_model_load_file_as(struct mp_model *m, const char *path, const struct mp_model_request *rq,
                                     struct mp_diag *d)
{
    return checked(m, mp_model_read_file_as(m, path, rq, d), d);
}
