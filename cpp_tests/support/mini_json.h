/* mini_json.h: a tiny JSON reader for the tests (compiles as C11 and as C++17).
 *
 * Just enough to read conformance fixtures at run time: objects, arrays, strings
 * (escapes decoded to UTF-8), unsigned integers, other numbers kept as text,
 * true/false/null. Every value remembers its [begin, end) span in the source text so a
 * sub-document (for example a placement) can be handed to a parser verbatim.
 * Not a validating parser; returns NULL on malformed input. Test code only. */
#ifndef MWS_TESTS_MINI_JSON_H
#define MWS_TESTS_MINI_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum mj_kind { MJ_NULL, MJ_BOOL, MJ_NUMBER, MJ_STRING, MJ_ARRAY, MJ_OBJECT } mj_kind;

typedef struct mj_value {
    mj_kind kind;
    size_t begin, end;       /* span in the source text */
    char *str;               /* MJ_STRING: decoded, NUL-terminated */
    uint64_t u64;            /* MJ_NUMBER: value if a non-negative integer */
    int boolean;             /* MJ_BOOL */
    size_t count;            /* MJ_ARRAY / MJ_OBJECT: number of items */
    char **keys;             /* MJ_OBJECT: decoded keys */
    struct mj_value **items; /* MJ_ARRAY / MJ_OBJECT: values */
} mj_value;

typedef struct mj_parser {
    const char *s;
    size_t n, i;
} mj_parser;

static inline void mj_free(mj_value *v) {
    size_t k;
    if (v == NULL) {
        return;
    }
    for (k = 0; k < v->count; k++) {
        mj_free(v->items[k]);
        if (v->keys != NULL) {
            free(v->keys[k]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static inline void mj_ws(mj_parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\r' || p->s[p->i] == '\t')) {
        p->i++;
    }
}

static inline int mj_hex4(mj_parser *p, unsigned *out) {
    unsigned v = 0;
    int k;
    if (p->i + 4 > p->n) {
        return 0;
    }
    for (k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v |= (unsigned)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v |= (unsigned)(c - 'A' + 10);
        } else {
            return 0;
        }
    }
    *out = v;
    return 1;
}

/* Parses a string at p->i (which is on the opening quote); returns malloc'ed UTF-8. */
static inline char *mj_string(mj_parser *p) {
    size_t cap = 16, len = 0;
    char *out = (char *)malloc(cap);
    if (out == NULL) {
        return NULL;
    }
    p->i++; /* opening quote */
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char buf[4];
        size_t blen = 0;
        char c = p->s[p->i++];
        if (c == '\\') {
            char e;
            if (p->i >= p->n) {
                break;
            }
            e = p->s[p->i++];
            switch (e) {
            case '"': buf[blen++] = '"'; break;
            case '\\': buf[blen++] = '\\'; break;
            case '/': buf[blen++] = '/'; break;
            case 'b': buf[blen++] = '\b'; break;
            case 'f': buf[blen++] = '\f'; break;
            case 'n': buf[blen++] = '\n'; break;
            case 'r': buf[blen++] = '\r'; break;
            case 't': buf[blen++] = '\t'; break;
            case 'u': {
                unsigned cp = 0, lo = 0;
                if (!mj_hex4(p, &cp)) {
                    free(out);
                    return NULL;
                }
                if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                    p->i += 2;
                    if (!mj_hex4(p, &lo)) {
                        free(out);
                        return NULL;
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp < 0x80) {
                    buf[blen++] = (unsigned char)cp;
                } else if (cp < 0x800) {
                    buf[blen++] = (unsigned char)(0xC0 | (cp >> 6));
                    buf[blen++] = (unsigned char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    buf[blen++] = (unsigned char)(0xE0 | (cp >> 12));
                    buf[blen++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    buf[blen++] = (unsigned char)(0x80 | (cp & 0x3F));
                } else {
                    buf[blen++] = (unsigned char)(0xF0 | (cp >> 18));
                    buf[blen++] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                    buf[blen++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    buf[blen++] = (unsigned char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                free(out);
                return NULL;
            }
        } else {
            buf[blen++] = (unsigned char)c;
        }
        if (len + blen + 1 > cap) {
            char *grown;
            cap = 2 * cap + blen;
            grown = (char *)realloc(out, cap);
            if (grown == NULL) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        memcpy(out + len, buf, blen);
        len += blen;
    }
    if (p->i >= p->n) {
        free(out);
        return NULL;
    }
    p->i++; /* closing quote */
    out[len] = '\0';
    return out;
}

static inline mj_value *mj_parse_value(mj_parser *p, int depth);

static inline int mj_push(mj_value *v, char *key, mj_value *item) {
    mj_value **items = (mj_value **)realloc(v->items, (v->count + 1) * sizeof *items);
    if (items == NULL) {
        return 0;
    }
    v->items = items;
    if (v->kind == MJ_OBJECT) {
        char **keys = (char **)realloc(v->keys, (v->count + 1) * sizeof *keys);
        if (keys == NULL) {
            return 0;
        }
        v->keys = keys;
        v->keys[v->count] = key;
    }
    v->items[v->count++] = item;
    return 1;
}

static inline mj_value *mj_parse_value(mj_parser *p, int depth) {
    mj_value *v;
    if (depth > 64) {
        return NULL;
    }
    mj_ws(p);
    if (p->i >= p->n) {
        return NULL;
    }
    v = (mj_value *)calloc(1, sizeof *v);
    if (v == NULL) {
        return NULL;
    }
    v->begin = p->i;
    switch (p->s[p->i]) {
    case '{':
    case '[': {
        char close = p->s[p->i] == '{' ? '}' : ']';
        v->kind = close == '}' ? MJ_OBJECT : MJ_ARRAY;
        p->i++;
        mj_ws(p);
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            break;
        }
        for (;;) {
            char *key = NULL;
            mj_value *item;
            mj_ws(p);
            if (v->kind == MJ_OBJECT) {
                if (p->i >= p->n || p->s[p->i] != '"' || (key = mj_string(p)) == NULL) {
                    mj_free(v);
                    return NULL;
                }
                mj_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') {
                    free(key);
                    mj_free(v);
                    return NULL;
                }
                p->i++;
            }
            item = mj_parse_value(p, depth + 1);
            if (item == NULL || !mj_push(v, key, item)) {
                free(key);
                mj_free(item);
                mj_free(v);
                return NULL;
            }
            mj_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == close) {
                p->i++;
                break;
            }
            mj_free(v);
            return NULL;
        }
        break;
    }
    case '"':
        v->kind = MJ_STRING;
        v->str = mj_string(p);
        if (v->str == NULL) {
            mj_free(v);
            return NULL;
        }
        break;
    case 't':
    case 'f':
    case 'n': {
        const char *word = p->s[p->i] == 't' ? "true" : p->s[p->i] == 'f' ? "false" : "null";
        size_t wl = strlen(word);
        if (p->i + wl > p->n || memcmp(p->s + p->i, word, wl) != 0) {
            mj_free(v);
            return NULL;
        }
        v->kind = word[0] == 'n' ? MJ_NULL : MJ_BOOL;
        v->boolean = word[0] == 't';
        p->i += wl;
        break;
    }
    default: {
        int integral = 1;
        size_t start = p->i;
        v->kind = MJ_NUMBER;
        while (p->i < p->n && strchr("0123456789+-.eE", p->s[p->i]) != NULL && p->s[p->i] != '\0') {
            if (p->s[p->i] < '0' || p->s[p->i] > '9') {
                integral = 0;
            } else if (integral) {
                v->u64 = v->u64 * 10u + (uint64_t)(p->s[p->i] - '0');
            }
            p->i++;
        }
        if (p->i == start) {
            mj_free(v);
            return NULL;
        }
        break;
    }
    }
    v->end = p->i;
    return v;
}

/* Parses `len` bytes of JSON; NULL if malformed. Free with mj_free. */
static inline mj_value *mj_parse(const char *text, size_t len) {
    mj_parser p;
    mj_value *v;
    p.s = text;
    p.n = len;
    p.i = 0;
    v = mj_parse_value(&p, 0);
    if (v != NULL) {
        mj_ws(&p);
        if (p.i != p.n) {
            mj_free(v);
            return NULL;
        }
    }
    return v;
}

/* Member `key` of an object, or NULL. */
static inline const mj_value *mj_get(const mj_value *v, const char *key) {
    size_t k;
    if (v == NULL || v->kind != MJ_OBJECT) {
        return NULL;
    }
    for (k = 0; k < v->count; k++) {
        if (strcmp(v->keys[k], key) == 0) {
            return v->items[k];
        }
    }
    return NULL;
}

/* Item `index` of an array, or NULL. */
static inline const mj_value *mj_at(const mj_value *v, size_t index) {
    if (v == NULL || v->kind != MJ_ARRAY || index >= v->count) {
        return NULL;
    }
    return v->items[index];
}

/* String member `key` of an object, or NULL. */
static inline const char *mj_str(const mj_value *v, const char *key) {
    const mj_value *m = mj_get(v, key);
    return m != NULL && m->kind == MJ_STRING ? m->str : NULL;
}

/* Unsigned integer member `key` of an object, or 0. */
static inline uint64_t mj_u64(const mj_value *v, const char *key) {
    const mj_value *m = mj_get(v, key);
    return m != NULL && m->kind == MJ_NUMBER ? m->u64 : 0;
}

/* Reads a whole file (malloc'ed, NUL-terminated); NULL on failure. */
static inline char *mj_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        size_t got;
        if (n + 4096 + 1 > cap) {
            char *grown;
            cap = 2 * cap + 4096 + 1;
            grown = (char *)realloc(buf, cap);
            if (grown == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) {
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

#endif /* MWS_TESTS_MINI_JSON_H */
