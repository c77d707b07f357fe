/* runtime/cli/tokenize_cmd.c — `kvpage tokenize`: a model's tokenizer on the command line (encode texts to ids,
 * or decode ids to text), e.g. to check a prompt's tokens or to compare with Hugging Face's tokenizer. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "runtime/cli/commands.h"
#include "runtime/text/tokenizer.h"

#define CMD "tokenize"
enum { MAX_TEXTS = 4096 };

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage tokenize --tokenizer PATH [--text TEXT ...] [options]\n"
               "       kvpage tokenize --tokenizer PATH --decode IDS\n\n"
               "Encodes each text with a model's tokenizer and prints its token ids, one line per text (ids separated\n"
               "by spaces); without --text, each line of stdin is a text. With --decode, prints the text of ids.\n\n"
               "  --tokenizer PATH   a GGUF model file, a Hugging Face folder or tokenizer.json, or a llama2.c\n"
               "                     tokenizer.bin (what generate and serve read for --model / --tokenizer)\n"
               "  --text TEXT        a text (repeatable; may hold newlines)\n"
               "  --no-bos           no BOS, even when the model's prompts start with one\n"
               "  --special          control tokens written in the text (<s>, <|im_start|>) are those tokens, as\n"
               "                     generate and serve read prompts\n"
               "  --decode [IDS]     decode: the ids after it (--decode 1 403 407, --decode \"1,403,407\" or\n"
               "                     --decode=1,403,407) are one text's, each --text or line of stdin another's\n"
               "                     (ids separated by spaces or commas)\n"
               "  --json             one object per text: {\"text\", \"ids\", \"pieces\"}\n"
               "  -h, --help         this help\n");
}

/* Ids written as "1 2, 3" into *ids (owned by the caller); KVP_EINVAL naming the first bad one. */
static kvp_status parse_ids(const char *s, const kvp_tokenizer *t, int32_t **ids, int32_t *n)
{
    size_t len = strlen(s);
    *ids = kvp_malloc((len / 2 + 1) * sizeof **ids);
    if (!*ids) return KVP_ERR(KVP_ENOMEM, "out of memory");
    *n = 0;
    for (const char *p = s;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) return KVP_OK;
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || v < 0 || v >= kvp_tok_vocab_size(t)) {
            kvp_free(*ids);
            *ids = NULL;
            return KVP_ERR(KVP_EINVAL, "'%.20s' is not a token id in [0, %d)", p, kvp_tok_vocab_size(t));
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = e;
    }
}

/* One text: its line (or JSON object) on stdout. */
static kvp_status one(const kvp_tokenizer *t, const char *text, unsigned flags, int decode, int json)
{
    int32_t *ids = NULL, n = 0;
    char *dec = NULL;
    kvp_status st = decode ? parse_ids(text, t, &ids, &n) : kvp_tok_encode_ex(t, text, strlen(text), flags, &ids, &n);
    if (st == KVP_OK && decode) st = kvp_tok_decode(t, -1, ids, n, &dec);
    cJSON *o = json && st == KVP_OK ? cJSON_CreateObject() : NULL;
    cJSON *a = o ? cJSON_AddArrayToObject(o, "ids") : NULL, *pieces = o ? cJSON_AddArrayToObject(o, "pieces") : NULL;
    if (json && st == KVP_OK && (!o || !a || !pieces || kvp_json_add_text(o, "text", decode ? dec : text) != KVP_OK))
        st = KVP_ERR(KVP_ENOMEM, "out of memory");
    for (int32_t i = 0; st == KVP_OK && i < n; i++) {
        if (o) {
            /* the piece as a JSON string (a byte-level piece may hold part of a character: U+FFFD then) */
            cJSON *tmp = cJSON_CreateObject();
            if (!tmp || kvp_json_add_text(tmp, "p", kvp_tok_piece(t, ids[i], NULL)) != KVP_OK ||
                !cJSON_AddItemToArray(pieces, cJSON_DetachItemFromObject(tmp, "p")) ||
                !cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i])))
                st = KVP_ERR(KVP_ENOMEM, "out of memory");
            cJSON_Delete(tmp);
        } else if (!decode) {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (st == KVP_OK && o) st = kvp_json_print(stdout, o);
    else if (st == KVP_OK) printf("%s\n", decode ? dec : "");
    cJSON_Delete(o);
    kvp_free(ids);
    kvp_free(dec);
    return st;
}

int kvp_cmd_tokenize(int argc, char **argv)
{
    enum { O_TOK = 256, O_TEXT, O_NO_BOS, O_SPECIAL, O_DECODE, O_JSON };
    static const struct option opts[] = {{"tokenizer", required_argument, 0, O_TOK}, {"text", required_argument, 0, O_TEXT},
                                         {"no-bos", no_argument, 0, O_NO_BOS},       {"special", no_argument, 0, O_SPECIAL},
                                         {"decode", optional_argument, 0, O_DECODE}, {"json", no_argument, 0, O_JSON},
                                         {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    const char *path = NULL, *texts[MAX_TEXTS];
    int ntexts = 0, decode = 0, json = 0, c;
    char *ids_arg = NULL; /* --decode's ids (its value and the arguments after the options), one text */
    unsigned flags = KVP_TOK_ADD_BOS;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_TOK: path = optarg; break;
        case O_TEXT:
            if (ntexts == MAX_TEXTS) return kvp_cli_usage_error(CMD, "at most %d --text", MAX_TEXTS);
            texts[ntexts++] = optarg;
            break;
        case O_NO_BOS: flags &= ~(unsigned)KVP_TOK_ADD_BOS; break;
        case O_SPECIAL: flags |= KVP_TOK_PARSE_SPECIAL; break;
        case O_DECODE:
            decode = 1;
            if (optarg && ntexts == MAX_TEXTS) return kvp_cli_usage_error(CMD, "at most %d texts", MAX_TEXTS);
            if (optarg) texts[ntexts++] = optarg;
            break;
        case O_JSON: json = 1; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(CMD, c, argv);
        }
    }
    if (optind < argc && !decode)
        return kvp_cli_usage_error(CMD, "unexpected argument '%s' (a text goes in --text; ids after --decode)",
                                   argv[optind]);
    if (!path) return kvp_cli_usage_error(CMD, "--tokenizer PATH is required");
    if (optind < argc) { /* --decode 1 403 407: the arguments left are one text's ids */
        size_t len = 1;
        for (int i = optind; i < argc; i++) len += strlen(argv[i]) + 1;
        if (ntexts == MAX_TEXTS) return kvp_cli_usage_error(CMD, "at most %d texts", MAX_TEXTS);
        if ((ids_arg = kvp_malloc(len)) == NULL) return kvp_cli_fail(CMD, KVP_ERR(KVP_ENOMEM, "out of memory"));
        ids_arg[0] = '\0';
        for (int i = optind; i < argc; i++) strcat(strcat(ids_arg, i > optind ? " " : ""), argv[i]);
        texts[ntexts++] = ids_arg;
    }
    kvp_tokenizer *t;
    kvp_status st = kvp_tok_load(path, 0, &t);
    if (st != KVP_OK) {
        kvp_free(ids_arg);
        return kvp_cli_fail(CMD, st);
    }
    for (int i = 0; st == KVP_OK && i < ntexts; i++) st = one(t, texts[i], flags, decode, json);
    if (ntexts == 0) { /* stdin, a text a line */
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        while (st == KVP_OK && (len = getline(&line, &cap, stdin)) >= 0) {
            if (len > 0 && line[len - 1] == '\n') line[len - 1] = '\0';
            st = one(t, line, flags, decode, json);
        }
        free(line);
    }
    kvp_tok_destroy(t);
    kvp_free(ids_arg);
    return st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail(CMD, st);
}
