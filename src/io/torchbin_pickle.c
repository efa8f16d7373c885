/* Pickle VM for torch state_dicts (see torchbin_pickle.h). Objects live in an arena owned by
 * the VM and are freed together, so shared and even cyclic references (via the memo) need no
 * reference counting. Every opcode reads at least one byte and creates at most one object or
 * one container item, so memory stays linear in the pickle's size. */
#include "io/torchbin_pickle.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TP_MAX_STACK 1000000
#define TP_MAX_MARKS 100000
#define TP_MAX_MEMO 1000000
#define TP_MAX_OBJECTS 8000000
#define TP_MAX_NUMEL ((uint64_t)1 << 60)

typedef enum { K_NONE, K_BOOL, K_INT, K_FLOAT, K_STR, K_BYTES, K_TUPLE, K_LIST, K_DICT, K_GLOBAL, K_STORAGE, K_TENSOR, K_OBJ } kind;
static const char *const k_kind[] = {"None", "bool", "int", "float", "str", "bytes", "tuple", "list", "dict", "global", "storage", "tensor", "object"};

typedef struct obj {
    kind k;
    int64_t i;        /* int/bool value; storage numel; tensor storage offset */
    st_dtype dtype;   /* storage */
    char *s;          /* str/bytes; global "module.name"; storage key */
    size_t slen;
    struct obj **it;  /* tuple/list items; dict k0 v0 k1 v1 ...; tensor [storage, size, stride] */
    size_t n, cap;
} obj;

typedef struct vm {
    const unsigned char *p;
    size_t len, pos, op; /* op: where the current opcode started, for messages */
    const char *what;
    glm_err *err;
    obj **st;
    size_t sn, scap;
    size_t *mk;
    size_t mn, mcap;
    obj **memo;
    size_t memo_cap, memo_n;
    obj **all;
    size_t nall, allcap;
    obj none, yes, no;
} vm;

static int bad(vm *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(vm *v, const char *fmt, ...) {
    char m[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    glm_fail(v->err, "%s: data.pkl byte %zu: %s", v->what, v->op, m);
    return -1;
}

static void grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    *p = glm_realloc(*p, c * elem);
    *cap = c;
}

static obj *mk(vm *v, kind k) {
    if (v->nall >= TP_MAX_OBJECTS) { bad(v, "more than %d objects; not a state_dict pickle", TP_MAX_OBJECTS); return NULL; }
    grow((void **)&v->all, &v->allcap, v->nall + 1, sizeof *v->all);
    obj *o = glm_calloc(1, sizeof *o);
    o->k = k;
    v->all[v->nall++] = o;
    return o;
}

static void add(obj *c, obj *x) {
    grow((void **)&c->it, &c->cap, c->n + 1, sizeof *c->it);
    c->it[c->n++] = x;
}

static int push(vm *v, obj *o) {
    if (!o) return -1;
    if (v->sn >= TP_MAX_STACK) return bad(v, "pickle stack deeper than %d", TP_MAX_STACK);
    grow((void **)&v->st, &v->scap, v->sn + 1, sizeof *v->st);
    v->st[v->sn++] = o;
    return 0;
}

static size_t base_of(const vm *v) { return v->mn ? v->mk[v->mn - 1] : 0; }

static obj *pop(vm *v) {
    if (v->sn <= base_of(v)) { bad(v, "stack underflow (malformed pickle)"); return NULL; }
    return v->st[--v->sn];
}

static obj *top(vm *v) {
    if (v->sn <= base_of(v)) { bad(v, "stack underflow (malformed pickle)"); return NULL; }
    return v->st[v->sn - 1];
}

static int pop_mark(vm *v, size_t *base) {
    if (!v->mn) return bad(v, "opcode needs a MARK but none is set");
    *base = v->mk[--v->mn];
    return 0;
}

static int need(vm *v, size_t k) { return v->len - v->pos >= k ? 0 : bad(v, "pickle is truncated"); }
static uint64_t le(const unsigned char *p, int n) { uint64_t x = 0; for (int i = n - 1; i >= 0; i--) x = x << 8 | p[i]; return x; }

static obj *mkstr(vm *v, kind k, size_t n) {
    if (need(v, n) != 0) return NULL;
    obj *o = mk(v, k);
    if (!o) return NULL;
    o->s = glm_malloc(n + 1);
    memcpy(o->s, v->p + v->pos, n);
    o->s[n] = 0;
    o->slen = n;
    v->pos += n;
    return o;
}

/* A text line (GLOBAL's "module\n" / PUT's "index\n"), at most 255 bytes. */
static int line(vm *v, char *out) {
    size_t i = 0;
    while (v->pos < v->len && v->p[v->pos] != '\n') {
        if (i >= 255) return bad(v, "text argument longer than 255 bytes");
        out[i++] = (char)v->p[v->pos++];
    }
    if (v->pos >= v->len) return bad(v, "pickle is truncated inside a text argument");
    v->pos++;
    out[i] = 0;
    return 0;
}

static int memo_put(vm *v, uint64_t idx) {
    obj *o = top(v);
    if (!o) return -1;
    if (idx >= TP_MAX_MEMO) return bad(v, "memo index %llu exceeds the limit %d", (unsigned long long)idx, TP_MAX_MEMO);
    if (idx >= v->memo_cap) {
        size_t old = v->memo_cap;
        grow((void **)&v->memo, &v->memo_cap, idx + 1, sizeof *v->memo);
        memset(v->memo + old, 0, (v->memo_cap - old) * sizeof *v->memo);
    }
    if (!v->memo[idx]) v->memo_n++;
    v->memo[idx] = o;
    return 0;
}

static int memo_get(vm *v, uint64_t idx) {
    if (idx >= v->memo_cap || !v->memo[idx]) return bad(v, "memo entry %llu was never stored", (unsigned long long)idx);
    return push(v, v->memo[idx]);
}

static obj *mkint(vm *v, int64_t x) {
    obj *o = mk(v, K_INT);
    if (o) o->i = x;
    return o;
}

/* LONG1/LONG4: little-endian two's complement; torch only needs 64-bit values. */
static obj *mklong(vm *v, uint64_t n) {
    if (n > 8) { bad(v, "integer of %llu bytes is too large", (unsigned long long)n); return NULL; }
    if (need(v, (size_t)n) != 0) return NULL;
    uint64_t x = le(v->p + v->pos, (int)n);
    if (n && n < 8 && (v->p[v->pos + n - 1] & 0x80)) x |= ~(uint64_t)0 << (8 * n);
    v->pos += (size_t)n;
    return mkint(v, (int64_t)x);
}

static obj *storage(vm *v, obj *pid) {
    static const struct { const char *name; st_dtype d; } types[] = {
        {"torch.FloatStorage", ST_F32}, {"torch.HalfStorage", ST_F16}, {"torch.BFloat16Storage", ST_BF16},
        {"torch.DoubleStorage", ST_F64}, {"torch.LongStorage", ST_I64}, {"torch.IntStorage", ST_I32},
        {"torch.ShortStorage", ST_I16}, {"torch.CharStorage", ST_I8}, {"torch.ByteStorage", ST_U8}, {"torch.BoolStorage", ST_BOOL}};
    if (pid->k != K_TUPLE || pid->n < 5 || pid->it[0]->k != K_STR || strcmp(pid->it[0]->s, "storage") != 0 ||
        pid->it[1]->k != K_GLOBAL || pid->it[2]->k != K_STR || pid->it[4]->k != K_INT) {
        bad(v, "persistent id is not ('storage', torch.XStorage, key, location, numel)");
        return NULL;
    }
    obj *key = pid->it[2], *o;
    if (!key->slen || key->slen > 64 || strlen(key->s) != key->slen || strchr(key->s, '/')) {
        bad(v, "storage key '%.64s' is not a plain archive name", key->s);
        return NULL;
    }
    if (pid->it[4]->i < 0 || (uint64_t)pid->it[4]->i > TP_MAX_NUMEL) {
        bad(v, "storage '%s' claims %lld elements", key->s, (long long)pid->it[4]->i);
        return NULL;
    }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (strcmp(pid->it[1]->s, types[i].name) != 0) continue;
        if (!(o = mk(v, K_STORAGE))) return NULL;
        o->dtype = types[i].d;
        o->s = glm_strdup(key->s);
        o->i = pid->it[4]->i;
        return o;
    }
    bad(v, "storage '%s' has type %.100s, which glmtrain cannot read", key->s, pid->it[1]->s);
    glm_hint(v->err, "supported: Float, Half, BFloat16, Double, Long, Int, Short, Char, Byte and Bool storages");
    return NULL;
}

/* REDUCE: the only "calls" a state_dict needs; anything else becomes an opaque object. */
static obj *call(vm *v, obj *f, obj *args) {
    if (f->k != K_GLOBAL) { bad(v, "REDUCE on a %s, not a global", k_kind[f->k]); return NULL; }
    const char *fn = f->s;
    if (strcmp(fn, "collections.OrderedDict") == 0) return mk(v, K_DICT);
    if (strcmp(fn, "torch._utils._rebuild_tensor_v2") == 0 || strcmp(fn, "torch._utils._rebuild_tensor") == 0) {
        if (args->k != K_TUPLE || args->n < 4 || args->it[0]->k != K_STORAGE || args->it[1]->k != K_INT ||
            args->it[2]->k != K_TUPLE || args->it[3]->k != K_TUPLE) {
            bad(v, "%s called without (storage, offset, size, stride)", fn);
            return NULL;
        }
        obj *t = mk(v, K_TENSOR);
        if (!t) return NULL;
        t->i = args->it[1]->i;
        for (int k = 0; k < 3; k++) add(t, args->it[k == 0 ? 0 : k + 1]);
        return t;
    }
    if (strcmp(fn, "torch._utils._rebuild_parameter") == 0 || strcmp(fn, "torch._utils._rebuild_parameter_with_state") == 0) {
        if (args->k != K_TUPLE || args->n < 1 || args->it[0]->k != K_TENSOR) { bad(v, "%s called without a tensor", fn); return NULL; }
        return args->it[0];
    }
    obj *o = mk(v, K_OBJ);
    if (o) o->s = glm_strdup(fn);
    return o;
}

/* Pops MARK..top into container c (a fresh tuple/list, or a dict taking pairs). */
static int collect(vm *v, obj *c) {
    size_t base = 0;
    if (!c || pop_mark(v, &base) != 0) return -1;
    if (c->k == K_DICT && (v->sn - base) % 2) return bad(v, "odd number of items for a dict");
    for (size_t i = base; i < v->sn; i++) add(c, v->st[i]);
    v->sn = base;
    return 0;
}

/* SETITEM(S)/APPEND(S): adds MARK..top (or the given item count) to the container below. */
static int extend(vm *v, int pairs, int from_mark) {
    size_t base = 0;
    if (from_mark) { if (pop_mark(v, &base) != 0) return -1; }
    else { if (v->sn < base_of(v) + (pairs ? 2 : 1)) return bad(v, "stack underflow (malformed pickle)"); base = v->sn - (pairs ? 2 : 1); }
    if (base == 0 || base - 1 < base_of(v)) return bad(v, "no container below the items");
    obj *c = v->st[base - 1];
    if (pairs && (v->sn - base) % 2) return bad(v, "SETITEMS with an odd number of items");
    if (c->k == (pairs ? K_DICT : K_LIST)) for (size_t i = base; i < v->sn; i++) add(c, v->st[i]);
    else if (c->k != K_OBJ) return bad(v, "%s on a %s", pairs ? "SETITEM" : "APPEND", k_kind[c->k]);
    v->sn = base; /* items of opaque objects (sets, custom classes) are dropped */
    return 0;
}

static int run(vm *v, obj **result) {
    char ln[256], ln2[256];
    for (;;) {
        if (v->pos >= v->len) return bad(v, "pickle ends without STOP (truncated)");
        v->op = v->pos;
        unsigned char op = v->p[v->pos++];
        obj *a, *b, *c;
        int rc = 0;
        switch (op) {
        case 0x80: /* PROTO */
            if (need(v, 1)) return -1;
            if (v->p[v->pos++] > 5) return bad(v, "pickle protocol %u is newer than 5", v->p[v->pos - 1]);
            break;
        case 0x95: /* FRAME: framing is advisory, the opcodes follow inline */
            if (need(v, 8)) return -1;
            v->pos += 8;
            break;
        case '}': rc = push(v, mk(v, K_DICT)); break;
        case ']': rc = push(v, mk(v, K_LIST)); break;
        case ')': rc = push(v, mk(v, K_TUPLE)); break;
        case 0x8f: rc = push(v, mk(v, K_OBJ)); break; /* EMPTY_SET */
        case '(':
            if (v->mn >= TP_MAX_MARKS) return bad(v, "more than %d nested MARKs", TP_MAX_MARKS);
            grow((void **)&v->mk, &v->mcap, v->mn + 1, sizeof *v->mk);
            v->mk[v->mn++] = v->sn;
            break;
        case 't': a = mk(v, K_TUPLE); rc = collect(v, a) || push(v, a); break;
        case 'l': a = mk(v, K_LIST); rc = collect(v, a) || push(v, a); break;
        case 'd': a = mk(v, K_DICT); rc = collect(v, a) || push(v, a); break;
        case 0x91: a = mk(v, K_OBJ); rc = collect(v, a) || push(v, a); break; /* FROZENSET */
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t k = (size_t)(op - 0x84);
            if (v->sn < base_of(v) + k) return bad(v, "stack underflow (malformed pickle)");
            if (!(a = mk(v, K_TUPLE))) return -1;
            for (size_t i = v->sn - k; i < v->sn; i++) add(a, v->st[i]);
            v->sn -= k;
            rc = push(v, a);
            break;
        }
        case 'X': if (need(v, 4)) return -1; v->pos += 4; rc = push(v, mkstr(v, K_STR, le(v->p + v->pos - 4, 4))); break;
        case 0x8c: case 'U': if (need(v, 1)) return -1; v->pos += 1; rc = push(v, mkstr(v, K_STR, v->p[v->pos - 1])); break;
        case 'T': if (need(v, 4)) return -1; v->pos += 4; rc = push(v, mkstr(v, K_STR, le(v->p + v->pos - 4, 4))); break;
        case 'B': if (need(v, 4)) return -1; v->pos += 4; rc = push(v, mkstr(v, K_BYTES, le(v->p + v->pos - 4, 4))); break;
        case 'C': if (need(v, 1)) return -1; v->pos += 1; rc = push(v, mkstr(v, K_BYTES, v->p[v->pos - 1])); break;
        case 0x8d: case 0x8e: { /* BINUNICODE8 / BINBYTES8 */
            if (need(v, 8)) return -1;
            uint64_t n = le(v->p + v->pos, 8);
            v->pos += 8;
            if (n > v->len - v->pos) return bad(v, "pickle is truncated");
            rc = push(v, mkstr(v, op == 0x8d ? K_STR : K_BYTES, (size_t)n));
            break;
        }
        case 'K': if (need(v, 1)) return -1; rc = push(v, mkint(v, v->p[v->pos])); v->pos += 1; break;
        case 'M': if (need(v, 2)) return -1; rc = push(v, mkint(v, (int64_t)le(v->p + v->pos, 2))); v->pos += 2; break;
        case 'J': if (need(v, 4)) return -1; rc = push(v, mkint(v, (int32_t)(uint32_t)le(v->p + v->pos, 4))); v->pos += 4; break;
        case 0x8a: if (need(v, 1)) return -1; v->pos += 1; rc = push(v, mklong(v, v->p[v->pos - 1])); break;
        case 0x8b: if (need(v, 4)) return -1; v->pos += 4; rc = push(v, mklong(v, le(v->p + v->pos - 4, 4))); break;
        case 0x88: v->yes.k = K_BOOL; v->yes.i = 1; rc = push(v, &v->yes); break;
        case 0x89: v->no.k = K_BOOL; rc = push(v, &v->no); break;
        case 'N': rc = push(v, &v->none); break;
        case 'G': {
            if (need(v, 8)) return -1;
            uint64_t x = 0;
            for (int i = 0; i < 8; i++) x = x << 8 | v->p[v->pos + i]; /* big-endian */
            v->pos += 8;
            if (!(a = mk(v, K_FLOAT))) return -1;
            double d;
            memcpy(&d, &x, 8);
            a->i = (int64_t)(d == d && d > -9e18 && d < 9e18 ? d : 0);
            rc = push(v, a);
            break;
        }
        case 'c':
            if (line(v, ln) || line(v, ln2) || !(a = mk(v, K_GLOBAL))) return -1;
            a->s = glm_malloc(strlen(ln) + strlen(ln2) + 2);
            sprintf(a->s, "%s.%s", ln, ln2);
            rc = push(v, a);
            break;
        case 0x93: /* STACK_GLOBAL */
            if (!(b = pop(v)) || !(a = pop(v))) return -1;
            if (a->k != K_STR || b->k != K_STR) return bad(v, "STACK_GLOBAL needs two strings");
            if (!(c = mk(v, K_GLOBAL))) return -1;
            c->s = glm_malloc(a->slen + b->slen + 2);
            sprintf(c->s, "%s.%s", a->s, b->s);
            rc = push(v, c);
            break;
        case 'R':
            if (!(b = pop(v)) || !(a = pop(v))) return -1;
            rc = push(v, call(v, a, b));
            break;
        case 0x81: /* NEWOBJ cls args */
            if (!(b = pop(v)) || !(a = pop(v))) return -1;
            rc = push(v, mk(v, K_OBJ));
            break;
        case 0x92: /* NEWOBJ_EX cls args kwargs */
            if (!pop(v) || !pop(v) || !pop(v)) return -1;
            rc = push(v, mk(v, K_OBJ));
            break;
        case 'b': /* BUILD: object state (e.g. OrderedDict._metadata) is not needed */
            if (!pop(v) || !top(v)) return -1;
            break;
        case 'Q': if (!(a = pop(v))) return -1; rc = push(v, storage(v, a)); break;
        case 'q': if (need(v, 1)) return -1; v->pos += 1; rc = memo_put(v, v->p[v->pos - 1]); break;
        case 'r': if (need(v, 4)) return -1; v->pos += 4; rc = memo_put(v, le(v->p + v->pos - 4, 4)); break;
        case 0x94: rc = memo_put(v, v->memo_n); break;
        case 'p': if (line(v, ln)) return -1; rc = memo_put(v, strtoull(ln, NULL, 10)); break;
        case 'h': if (need(v, 1)) return -1; v->pos += 1; rc = memo_get(v, v->p[v->pos - 1]); break;
        case 'j': if (need(v, 4)) return -1; v->pos += 4; rc = memo_get(v, le(v->p + v->pos - 4, 4)); break;
        case 'g': if (line(v, ln)) return -1; rc = memo_get(v, strtoull(ln, NULL, 10)); break;
        case 's': rc = extend(v, 1, 0); break;
        case 'u': rc = extend(v, 1, 1); break;
        case 'a': rc = extend(v, 0, 0); break;
        case 'e': rc = extend(v, 0, 1); break;
        case 0x90: { /* ADDITEMS to a set: dropped */
            size_t base = 0;
            if (pop_mark(v, &base) || base == 0 || base - 1 < base_of(v)) return bad(v, "ADDITEMS without a set");
            v->sn = base;
            break;
        }
        case '0':
            if (v->sn > base_of(v)) v->sn--;
            else { size_t base = 0; rc = pop_mark(v, &base); }
            break;
        case '1': { size_t base = 0; rc = pop_mark(v, &base); if (!rc) v->sn = base; break; }
        case '2': if (!(a = top(v))) return -1; rc = push(v, a); break;
        case '.':
            if (!(*result = pop(v))) return -1;
            return 0;
        default:
            return bad(v, "unsupported pickle opcode 0x%02x; is this a torch.save state_dict?", op);
        }
        if (rc) return -1;
    }
}

void tp_free(tp_tensor *t, int n) {
    for (int i = 0; i < n; i++) { free(t[i].name); free(t[i].key); }
    free(t);
}

/* Checks one tensor's geometry against its storage and fills *t. */
static int to_tensor(vm *v, const char *name, const obj *o, tp_tensor *t) {
    const obj *s = o->it[0], *size = o->it[1], *stride = o->it[2];
    const char *w = v->what;
    if (size->n > ST_MAX_DIMS) return glm_fail(v->err, "%s: tensor '%s' has %zu dimensions (at most %d supported)", w, name, size->n, ST_MAX_DIMS);
    if (stride->n != size->n) return glm_fail(v->err, "%s: tensor '%s' has %zu sizes but %zu strides", w, name, size->n, stride->n);
    if (o->i < 0) return glm_fail(v->err, "%s: tensor '%s' has negative storage offset %lld", w, name, (long long)o->i);
    uint64_t numel = 1, last = (uint64_t)o->i;
    int ovf = 0;
    for (size_t d = 0; d < size->n; d++) {
        const obj *a = size->it[d], *b = stride->it[d];
        if (a->k != K_INT || b->k != K_INT || a->i < 0 || b->i < 0)
            return glm_fail(v->err, "%s: tensor '%s': size/stride entry %zu is not a non-negative integer", w, name, d);
        t->shape[d] = a->i;
        t->stride[d] = b->i;
        uint64_t span;
        ovf |= __builtin_mul_overflow(numel, (uint64_t)a->i, &numel) || numel > TP_MAX_NUMEL;
        if (a->i > 0) ovf |= __builtin_mul_overflow((uint64_t)(a->i - 1), (uint64_t)b->i, &span) || __builtin_add_overflow(last, span, &last);
    }
    if (ovf) return glm_fail(v->err, "%s: tensor '%s' has an absurd shape or stride (element count overflows)", w, name);
    if ((uint64_t)o->i > (uint64_t)s->i) /* even an empty view starts inside (or at the end of) its storage */
        return glm_fail(v->err, "%s: tensor '%s' starts at element %lld of storage '%s', which holds only %lld elements", w, name,
                        (long long)o->i, s->s, (long long)s->i);
    if (numel > 0 && last >= (uint64_t)s->i)
        return glm_fail(v->err, "%s: tensor '%s' reaches element %llu of storage '%s', which holds only %lld elements (lying sizes?)", w, name,
                        (unsigned long long)last, s->s, (long long)s->i);
    t->ndim = (int)size->n;
    t->offset = (uint64_t)o->i;
    t->dtype = s->dtype;
    t->storage_numel = (uint64_t)s->i;
    t->name = glm_strdup(name);
    t->key = glm_strdup(s->s);
    return 0;
}

int tp_load(const unsigned char *data, size_t len, const char *what, tp_tensor **out, int *nout, glm_err *err) {
    vm v = {.p = data, .len = len, .what = what, .err = err};
    obj *res = NULL;
    tp_tensor *t = NULL;
    int n = 0, rc = -1;
    *out = NULL;
    *nout = 0;
    if (run(&v, &res) != 0) goto done;
    if (res->k != K_DICT) {
        glm_fail(err, "%s: data.pkl holds a %s, not a dict of tensors", what, k_kind[res->k]);
        glm_hint(err, "save weights with torch.save(model.state_dict(), path)");
        goto done;
    }
    t = glm_calloc(res->n / 2 + 1, sizeof *t);
    for (size_t i = 0; i + 1 < res->n; i += 2) {
        const obj *k = res->it[i], *val = res->it[i + 1];
        if (k->k != K_STR || val->k != K_TENSOR) continue;
        if (strlen(k->s) != k->slen || !k->slen) { glm_fail(err, "%s: a tensor name is empty or holds a NUL byte", what); goto done; }
        if (to_tensor(&v, k->s, val, &t[n]) != 0) goto done;
        n++;
    }
    if (n == 0 && res->n) {
        glm_fail(err, "%s: the top-level dict has %zu entries but no tensors", what, res->n / 2);
        glm_hint(err, "is this a training checkpoint? save model.state_dict() instead");
        goto done;
    }
    *out = t;
    *nout = n;
    t = NULL;
    n = 0;
    rc = 0;
done:
    tp_free(t, n);
    for (size_t i = 0; i < v.nall; i++) { free(v.all[i]->s); free(v.all[i]->it); free(v.all[i]); }
    free(v.all);
    free(v.st);
    free(v.mk);
    free(v.memo);
    return rc;
}
