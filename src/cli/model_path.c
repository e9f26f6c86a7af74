/* model_path.c — MODEL as the user may give it: a model file, a model directory holding
 * config.json (what save_pretrained writes and the Hub serves), or a Hub id ORG/NAME found in
 * the local Hugging Face cache.  Never the network: when the config is not there, the message
 * says where memplan looked and how to fetch only that file.
 *
 * The cache layout (huggingface_hub, file_download.py): $HF_HUB_CACHE, else $HF_HOME/hub, else
 * ~/.cache/huggingface/hub; a repo is models--ORG--NAME/, refs/main holds the commit of the
 * default branch and snapshots/<commit>/config.json is the file.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h> /* PATH_MAX */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

/* "memplan: error: ..." for a MODEL that cannot be found; returns MP_EXIT_INPUT. */
static int input_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mp_progress_done();
    fputs("memplan: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return MP_EXIT_INPUT;
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The hub cache directory into out (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub). */
static void hub_cache(char *out, size_t cap)
{
    const char *v = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *user = getenv("HOME");
    if (v && *v)
        snprintf(out, cap, "%s", v);
    else if (home && *home)
        snprintf(out, cap, "%s/hub", home);
    else
        snprintf(out, cap, "%s/.cache/huggingface/hub", user && *user ? user : ".");
}

/* True when id looks like a Hub id: ORG/NAME, both non-empty, of [A-Za-z0-9._-], not a .json
 * file name (a missing model file is the loader's "no such file"). */
static bool hub_id(const char *id)
{
    const char *slash = strchr(id, '/');
    size_t n = strlen(id);
    if (!slash || slash == id || !slash[1] || strchr(slash + 1, '/') || (n > 5 && !strcmp(id + n - 5, ".json")))
        return false;
    for (const char *c = id; *c; c++)
        if (c != slash && !((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                            *c == '.' || *c == '_' || *c == '-'))
            return false;
    return true;
}

/* repo/snapshots/<commit>/config.json: refs/main's commit, else the only (or first by name)
 * snapshot that has one.  True when found. */
static bool snapshot_config(const char *repo, char *out, size_t cap)
{
    char ref[PATH_MAX], commit[128] = "";
    snprintf(ref, sizeof ref, "%s/refs/main", repo);
    FILE *f = fopen(ref, "r");
    if (f) {
        if (!fgets(commit, sizeof commit, f))
            commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
        if (commit[0] && !strchr(commit, '/') &&
            (size_t)snprintf(out, cap, "%s/snapshots/%s/config.json", repo, commit) < cap && is_file(out))
            return true;
    }
    char snaps[PATH_MAX];
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
    struct dirent **names = NULL;
    int n = scandir(snaps, &names, NULL, alphasort);
    bool found = false;
    for (int i = 0; i < n; i++) {
        if (!found && names[i]->d_name[0] != '.' &&
            (size_t)snprintf(out, cap, "%s/%s/config.json", snaps, names[i]->d_name) < cap && is_file(out))
            found = true;
        free(names[i]);
    }
    free(names);
    return found;
}

int cli_resolve_model(const char *arg, char *out, size_t cap)
{
    if (is_file(arg) || (!is_dir(arg) && !hub_id(arg))) { /* a file, or nothing to resolve: the loader says */
        snprintf(out, cap, "%s", arg);
        return 0;
    }
    if (is_dir(arg)) {
        size_t n = strlen(arg);
        if ((size_t)snprintf(out, cap, "%s%sconfig.json", arg, n && arg[n - 1] == '/' ? "" : "/") >= cap)
            return input_error("%s: the path is too long", arg);
        if (is_file(out))
            return 0;
        return input_error("%s: a directory without config.json (give a model file, or a model directory "
                               "as save_pretrained writes it)", arg);
    }
    char cache[PATH_MAX / 2], repo[PATH_MAX];
    hub_cache(cache, sizeof cache);
    const char *slash = strchr(arg, '/');
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - arg), arg, slash + 1);
    if (snapshot_config(repo, out, cap))
        return 0;
    return input_error("%s: not a file, nor in the Hugging Face cache (%s); memplan never downloads: "
                           "fetch the config alone with 'hf download %s config.json'", arg, repo, arg);
}
