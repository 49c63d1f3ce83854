#!/usr/bin/env node
// Extract MovieLens "latest-small" (2016) from Debian's r-cran-dslabs 0.7.4-1 (an R lazy-load
// database: data/Rdata.rdx + data/Rdata.rdb, object `movielens`) and write the click framing
// used by `--data movielens`. Node only, no npm packages (zlib is built in; bzip2/xz objects go
// through the Debian `bzip2`/`xz` tools).
//
//   node scripts/movielens_extract.js PKG_DATA_DIR OUT_DIR
//
// PKG_DATA_DIR holds Rdata.rdx and Rdata.rdb (…/site-library/dslabs/data). Writes into OUT_DIR:
//
//   ratings.tsv       one line per rating, sorted by (timestamp, userId, movieId); header line
//                     userId movieId rating timestamp year genre genres title
//   clicks_train.tsv  the click framing, same order; header line
//   clicks_test.tsv   label user item year genre hour weekday timestamp history
//
// Formats (tab-separated, '\n' line ends, UTF-8, first line = the header above, verbatim):
//   label      1 if rating >= 4 else 0
//   user       MovieLens userId (1..671)
//   item       MovieLens movieId (1..163949)
//   year       release year; 0 = unknown (R's NA: a few titles have no year)
//   genre      1-based index of the movie's genre combination in R's factor levels
//              ("Action|Adventure|Sci-Fi" is one level), 0 = unknown; the level strings
//              are in ratings.tsv's `genres` column
//   hour       0..23, hour of the rating's timestamp in UTC
//   weekday    0..6, weekday of the timestamp in UTC, 0 = Sunday
//   timestamp  seconds since 1970-01-01 UTC
//   history    the same user's movieIds rated at strictly earlier timestamps (ratings in the
//              same second as this one are not history: their order is unknown), oldest
//              first, most recent last, at most 256 (the most recent ones); space-separated;
//              an empty field = no history
// Split by time: cutoff T = the timestamp of the rating at position floor(0.8 N) of the
// ratings sorted by time; train = timestamp < T, test = timestamp >= T (so one second never
// straddles the split). The history of a test rating includes the user's earlier test
// ratings: they happened before it.
//
// Every check that fails exits 1 with "movielens_extract: error: ..." and a hint.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const { execFileSync } = require('child_process');

const EXPECT = { ratings: 100004, users: 671, movies: 9066, positiveRate: 0.516 };
const HIST_CAP = 256;
const TEST_FRACTION = 0.2;

function fail(msg, hint) {
    process.stderr.write(`movielens_extract: error: ${msg}` + (hint ? ` (hint: ${hint})` : '') + '\n');
    process.exit(1);
}

// ---- R serialization (XDR, format versions 2 and 3), enough for data frames ----------------
// Values come back as {type, value, attr}: value is an Array / Int32Array / Float64Array, a
// string (CHARSXP, null = NA_STRING) or a pairlist [{tag, value}], attr a pairlist or null.
const SXP = {
    NIL: 0, SYM: 1, LIST: 2, CLO: 3, ENV: 4, PROM: 5, LANG: 6, CHAR: 9, LGL: 10, INT: 13, REAL: 14,
    CPLX: 15, STR: 16, DOT: 17, VEC: 19, EXPR: 20, RAW: 24, S4: 25,
    ALTREP: 238, ATTRLIST: 239, ATTRLANG: 240, BASEENV: 241, EMPTYENV: 242, GENERICREF: 245,
    CLASSREF: 246, PERSIST: 247, PACKAGE: 248, NAMESPACE: 249, BASENAMESPACE: 250,
    MISSINGARG: 251, UNBOUNDVALUE: 252, GLOBALENV: 253, NILVALUE: 254, REF: 255,
};
const NA_INTEGER = -2147483648;
const UTF8_MASK = 1 << 3, LATIN1_MASK = 1 << 2;

function unserialize(buf, what) {
    let pos = 0;
    const need = (n) => {
        if (pos + n > buf.length) fail(`${what}: serialized data ends early at byte ${pos}`, 'the package file is damaged; delete data/movielens and fetch again');
    };
    const int = () => { need(4); const v = buf.readInt32BE(pos); pos += 4; return v; };
    const refs = [];
    if (buf.length < 2 || buf.toString('latin1', 0, 2) !== 'X\n')
        fail(`${what}: not R's XDR serialization (starts with ${JSON.stringify(buf.toString('latin1', 0, 2))})`, 'only format "X\\n" is supported');
    pos = 2;
    const version = int();
    int(); int(); // writer's R version, oldest R that reads it
    if (version === 3) { const n = int(); need(n); pos += n; } // native encoding name
    else if (version !== 2) fail(`${what}: R serialization version ${version}`, 'only versions 2 and 3 are supported');

    const length = () => {
        const n = int();
        if (n !== -1) return n;
        const hi = int(), lo = int();
        return hi * 4294967296 + (lo >>> 0);
    };
    const pairlistRest = (flags, type) => {
        // A pairlist is read cell by cell iteratively: long lists would overflow recursion.
        const cells = [];
        let f = flags;
        for (;;) {
            const attr = f & (1 << 9) ? item() : null;
            const tag = f & (1 << 10) ? item() : null;
            cells.push({ tag: tag && tag.type === SXP.SYM ? tag.value : null, value: item(), attr });
            f = int();
            if ((f & 0xff) === SXP.NILVALUE) break;
            if ((f & 0xff) !== type) return { type, value: cells, tail: itemWithFlags(f) };
        }
        return { type, value: cells, attr: cells[0].attr };
    };
    const altrep = () => {
        const info = item(), state = item(), attr = item();
        const cls = info.value[0].value.value;
        let v;
        if (cls === 'compact_intseq' || cls === 'compact_realseq') {
            const [n, n1, inc] = state.value;
            v = cls === 'compact_intseq' ? new Int32Array(n) : new Float64Array(n);
            for (let i = 0; i < n; i++) v[i] = n1 + i * inc;
            return { type: cls === 'compact_intseq' ? SXP.INT : SXP.REAL, value: v, attr: attr.type === SXP.NIL ? null : attr.value };
        }
        if (cls.startsWith('wrap_')) {
            const x = state.value[0];
            return { type: x.type, value: x.value, attr: attr.type === SXP.NIL ? x.attr : attr.value };
        }
        if (cls === 'deferred_string') fail(`${what}: ALTREP deferred_string`, 'not supported by this reader');
        fail(`${what}: unknown ALTREP class ${cls}`, 'this reader knows compact_intseq, compact_realseq and wrap_*');
    };
    const item = () => itemWithFlags(int());
    function itemWithFlags(flags) {
        const type = flags & 0xff, hasAttr = (flags & (1 << 9)) !== 0;
        const levels = flags >>> 12;
        switch (type) {
        case SXP.NILVALUE: case SXP.NIL: return { type: SXP.NIL, value: null, attr: null };
        case SXP.EMPTYENV: case SXP.BASEENV: case SXP.GLOBALENV: case SXP.UNBOUNDVALUE:
        case SXP.MISSINGARG: case SXP.BASENAMESPACE:
            return { type, value: null, attr: null };
        case SXP.REF: {
            let i = flags >> 8;
            if (i === 0) i = int();
            if (i < 1 || i > refs.length) fail(`${what}: reference ${i} out of range (${refs.length} known)`, 'the package file is damaged');
            return refs[i - 1];
        }
        case SXP.SYM: {
            const name = item();
            const v = { type: SXP.SYM, value: name.value, attr: null };
            refs.push(v);
            return v;
        }
        case SXP.PACKAGE: case SXP.NAMESPACE: case SXP.PERSIST: {
            // R's InStringVec: a 0, a length, then that many CHARSXPs.
            if (int() !== 0) fail(`${what}: bad string vector of a ${type} object`, 'the package file is damaged');
            const names = Array.from({ length: length() }, () => item().value);
            const v = { type, value: names, attr: null };
            refs.push(v);
            return v;
        }
        case SXP.ENV: {
            const v = { type, value: null, attr: null };
            refs.push(v);
            int(); // locked
            v.enclos = item(); v.frame = item(); v.hashtab = item(); v.attr = item();
            return v;
        }
        case SXP.LIST: case SXP.LANG: case SXP.CLO: case SXP.PROM: case SXP.DOT:
        case SXP.ATTRLIST: case SXP.ATTRLANG:
            return pairlistRest(flags, type);
        case SXP.ALTREP: return altrep();
        case SXP.CHAR: {
            const n = int();
            if (n === -1) return { type, value: null, attr: null };
            need(n);
            const enc = levels & LATIN1_MASK ? 'latin1' : 'utf8';
            const s = buf.toString(enc, pos, pos + n);
            pos += n;
            return { type, value: s, attr: null };
        }
        }
        let value;
        switch (type) {
        case SXP.LGL: case SXP.INT: {
            const n = length();
            need(4 * n);
            value = new Int32Array(n);
            for (let i = 0; i < n; i++, pos += 4) value[i] = buf.readInt32BE(pos);
            break;
        }
        case SXP.REAL: {
            const n = length();
            need(8 * n);
            value = new Float64Array(n);
            for (let i = 0; i < n; i++, pos += 8) value[i] = buf.readDoubleBE(pos);
            break;
        }
        case SXP.STR: {
            const n = length();
            value = new Array(n);
            for (let i = 0; i < n; i++) {
                const c = item();
                if (c.type !== SXP.CHAR) fail(`${what}: string vector element of type ${c.type}`, 'the package file is damaged');
                value[i] = c.value;
            }
            break;
        }
        case SXP.VEC: case SXP.EXPR: {
            const n = length();
            value = new Array(n);
            for (let i = 0; i < n; i++) value[i] = item();
            break;
        }
        case SXP.RAW: {
            const n = length();
            need(n);
            value = buf.subarray(pos, pos + n);
            pos += n;
            break;
        }
        default:
            fail(`${what}: R object type ${type} at byte ${pos - 4}`, 'this reader handles data frames only (lists, vectors, factors, attributes)');
        }
        const attr = hasAttr ? item().value : null;
        return { type, value, attr };
    }
    const root = item();
    if (pos !== buf.length) fail(`${what}: ${buf.length - pos} bytes left after the object`, 'the package file is damaged');
    return root;
}

const attrOf = (obj, name) => {
    for (const c of obj.attr || []) if (c.tag === name) return c.value;
    return null;
};
const namesOf = (obj) => {
    const n = attrOf(obj, 'names');
    return n ? n.value : null;
};

// ---- the lazy-load database -----------------------------------------------------------------
// Rdata.rdx is a gzip'ed serialization (saveRDS) of list(variables = list(name = c(offset,
// length)), references, compressed). Each object in Rdata.rdb is: 4-byte big-endian
// uncompressed length, then for compressed = TRUE/1 a zlib stream; for 2 (bzip2) and 3 (xz) one
// method byte first: '0' stored, '1' zlib, '2' bzip2, 'Z' xz (R's R_decompress1/2/3).
function readIndex(file) {
    let raw;
    try { raw = fs.readFileSync(file); } catch (e) { fail(`cannot read ${file}: ${e.message}`, 'run scripts/fetch_movielens.sh'); }
    let buf;
    try { buf = zlib.gunzipSync(raw); } catch (e) { fail(`${file} is not gzip data: ${e.message}`, 'the package file is damaged; delete data/movielens and fetch again'); }
    const idx = unserialize(buf, file);
    const names = namesOf(idx);
    if (idx.type !== SXP.VEC || !names) fail(`${file}: the index is not a named list`, 'is this an R lazy-load index?');
    const field = (n) => {
        const i = names.indexOf(n);
        if (i < 0) fail(`${file}: the index has no '${n}'`, 'is this an R lazy-load index?');
        return idx.value[i];
    };
    const vars = field('variables'), comp = field('compressed');
    const vnames = namesOf(vars) || [];
    const variables = {};
    vnames.forEach((n, i) => { variables[n] = Array.from(vars.value[i].value); });
    return { variables, compressed: comp.value[0] };
}

function decompressTool(tool, data) {
    try {
        return execFileSync(tool, ['-dc'], { input: data, maxBuffer: 1 << 30 });
    } catch (e) {
        fail(`${tool} -dc failed: ${e.message.split('\n')[0]}`, `apt-get install ${tool === 'xz' ? 'xz-utils' : 'bzip2'}`);
    }
}

function fetchObject(rdbFile, [offset, len], compressed, name) {
    const fd = fs.openSync(rdbFile, 'r');
    const blob = Buffer.alloc(len);
    const got = fs.readSync(fd, blob, 0, len, offset);
    fs.closeSync(fd);
    if (got !== len) fail(`${rdbFile}: object '${name}' at ${offset}+${len} is past the end of the file`, 'the package file is damaged');
    const outLen = blob.readUInt32BE(0);
    let out;
    if (compressed === 1) out = zlib.inflateSync(blob.subarray(4));
    else if (compressed === 2 || compressed === 3) {
        const method = String.fromCharCode(blob[4]), body = blob.subarray(5);
        if (method === '0') out = body;
        else if (method === '1') out = zlib.inflateSync(body);
        else if (method === '2') out = decompressTool('bzip2', body);
        else if (method === 'Z') out = decompressTool('xz', body);
        else fail(`${rdbFile}: object '${name}' has unknown compression method byte 0x${blob[4].toString(16)}`, 'the package file is damaged');
    } else fail(`${rdbFile}: index says compressed = ${compressed}`, 'expected 1, 2 or 3');
    if (out.length !== outLen) fail(`${rdbFile}: object '${name}' decompressed to ${out.length} bytes, header says ${outLen}`, 'the package file is damaged');
    return out;
}

// ---- the data frame -> columns --------------------------------------------------------------
function readMovielens(dir) {
    const index = readIndex(path.join(dir, 'Rdata.rdx'));
    const entry = index.variables.movielens;
    if (!entry) fail(`${dir}/Rdata.rdx has no object 'movielens' (objects: ${Object.keys(index.variables).join(', ')})`, 'is this r-cran-dslabs 0.7.4-1?');
    const df = unserialize(fetchObject(path.join(dir, 'Rdata.rdb'), entry, index.compressed, 'movielens'), 'movielens');
    const names = namesOf(df);
    const cls = attrOf(df, 'class');
    if (df.type !== SXP.VEC || !names || !cls || !cls.value.includes('data.frame')) fail("object 'movielens' is not a data frame", 'is this r-cran-dslabs 0.7.4-1?');
    const col = (n, types) => {
        const i = names.indexOf(n);
        if (i < 0) fail(`movielens has no column '${n}' (columns: ${names.join(', ')})`, 'is this r-cran-dslabs 0.7.4-1?');
        const c = df.value[i];
        if (!types.includes(c.type)) fail(`movielens column '${n}' has R type ${c.type}, expected ${types.join(' or ')}`, 'is this r-cran-dslabs 0.7.4-1?');
        return c;
    };
    const genres = col('genres', [SXP.INT]);
    const levels = attrOf(genres, 'levels');
    if (!levels || levels.type !== SXP.STR) fail("movielens column 'genres' is not a factor", 'is this r-cran-dslabs 0.7.4-1?');
    const asNum = (c) => Float64Array.from(c.value, (x) => (c.type === SXP.INT && x === NA_INTEGER ? NaN : x));
    const out = {
        movieId: asNum(col('movieId', [SXP.INT, SXP.REAL])),
        title: col('title', [SXP.STR]).value,
        year: asNum(col('year', [SXP.INT, SXP.REAL])),
        genre: genres.value, // 1-based level index, NA_INTEGER = NA
        genreLevels: levels.value,
        userId: asNum(col('userId', [SXP.INT, SXP.REAL])),
        rating: asNum(col('rating', [SXP.INT, SXP.REAL])),
        timestamp: asNum(col('timestamp', [SXP.INT, SXP.REAL])),
    };
    const n = out.movieId.length;
    for (const k of ['title', 'year', 'genre', 'userId', 'rating', 'timestamp'])
        if (out[k].length !== n) fail(`movielens column '${k}' has ${out[k].length} rows, movieId has ${n}`, 'the package file is damaged');
    return out;
}

function validate(m) {
    const n = m.movieId.length;
    const bad = (i, what) => fail(`movielens row ${i + 1}: ${what}`, 'the extracted data is not what this tool expects');
    const isId = (x) => Number.isInteger(x) && x >= 1 && x < 2 ** 31;
    for (let i = 0; i < n; i++) {
        if (!isId(m.userId[i])) bad(i, `userId ${m.userId[i]}`);
        if (!isId(m.movieId[i])) bad(i, `movieId ${m.movieId[i]}`);
        const r = m.rating[i];
        if (!(r >= 0.5 && r <= 5 && Number.isInteger(r * 2))) bad(i, `rating ${r} not in 0.5, 1, ..., 5`);
        if (!Number.isInteger(m.timestamp[i]) || m.timestamp[i] < 0) bad(i, `timestamp ${m.timestamp[i]}`);
        const y = m.year[i];
        if (!Number.isNaN(y) && !(Number.isInteger(y) && y >= 1800 && y <= 2100)) bad(i, `year ${y}`);
        const g = m.genre[i];
        if (g !== NA_INTEGER && (g < 1 || g > m.genreLevels.length)) bad(i, `genre level ${g} of ${m.genreLevels.length}`);
        const t = m.title[i];
        if (t !== null && /[\t\n\r]/.test(t)) bad(i, 'title holds a tab or line break');
    }
    for (const l of m.genreLevels) if (l === null || /[\t\n\r]/.test(l)) fail(`genre level ${JSON.stringify(l)} is NA or holds a tab or line break`, 'the extracted data is not what this tool expects');
    const users = new Set(m.userId).size, movies = new Set(m.movieId).size;
    const got = { ratings: n, users, movies };
    for (const k of ['ratings', 'users', 'movies'])
        if (got[k] !== EXPECT[k]) fail(`movielens has ${got[k]} ${k}, expected ${EXPECT[k]}`, 'is this r-cran-dslabs 0.7.4-1 (MovieLens latest-small 2016)?');
    return got;
}

// ---- click framing --------------------------------------------------------------------------
function writeAll(file, parts) {
    const tmp = file + '.tmp';
    try {
        fs.writeFileSync(tmp, parts.join(''));
        fs.renameSync(tmp, file);
    } catch (e) { fail(`cannot write ${file}: ${e.message}`, 'check that the folder is writable and the disk has space'); }
}

function frame(m, outDir) {
    const n = m.movieId.length;
    const order = Array.from({ length: n }, (_, i) => i);
    order.sort((a, b) => m.timestamp[a] - m.timestamp[b] || m.userId[a] - m.userId[b] || m.movieId[a] - m.movieId[b] || a - b);
    const cutoff = m.timestamp[order[Math.floor((1 - TEST_FRACTION) * n)]];

    const ratingLines = ['userId\tmovieId\trating\ttimestamp\tyear\tgenre\tgenres\ttitle\n'];
    const HEADER = 'label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory\n';
    const train = [HEADER], test = [HEADER];
    // Per user: movies already in the history (timestamp < current second) and those of the
    // current second, which join the history when time moves past it.
    const hist = new Map(), pending = new Map();
    const stats = { train: 0, test: 0, trainPos: 0, testPos: 0, emptyHistory: 0, histSum: 0 };
    for (const i of order) {
        const u = m.userId[i], t = m.timestamp[i];
        let h = hist.get(u);
        if (!h) { h = []; hist.set(u, h); }
        const p = pending.get(u);
        if (p && p.t < t) {
            h.push(...p.items);
            if (h.length > HIST_CAP) h.splice(0, h.length - HIST_CAP);
            pending.delete(u);
        }
        if (pending.has(u)) pending.get(u).items.push(m.movieId[i]);
        else pending.set(u, { t, items: [m.movieId[i]] });

        const year = Number.isNaN(m.year[i]) ? 0 : m.year[i];
        const g = m.genre[i] === NA_INTEGER ? 0 : m.genre[i];
        const label = m.rating[i] >= 4 ? 1 : 0;
        const d = new Date(t * 1000);
        const line = `${label}\t${u}\t${m.movieId[i]}\t${year}\t${g}\t${d.getUTCHours()}\t${d.getUTCDay()}\t${t}\t${h.join(' ')}\n`;
        const isTest = t >= cutoff;
        (isTest ? test : train).push(line);
        if (isTest) { stats.test++; stats.testPos += label; } else { stats.train++; stats.trainPos += label; }
        if (h.length === 0) stats.emptyHistory++;
        stats.histSum += h.length;
        ratingLines.push(`${u}\t${m.movieId[i]}\t${m.rating[i]}\t${t}\t${year}\t${g}\t${g ? m.genreLevels[g - 1] : ''}\t${m.title[i] === null ? '' : m.title[i]}\n`);
    }
    writeAll(path.join(outDir, 'ratings.tsv'), ratingLines);
    writeAll(path.join(outDir, 'clicks_train.tsv'), train);
    writeAll(path.join(outDir, 'clicks_test.tsv'), test);
    stats.cutoff = cutoff;
    return stats;
}

function main() {
    const [dir, outDir] = process.argv.slice(2);
    if (!dir || !outDir) fail('usage: node scripts/movielens_extract.js PKG_DATA_DIR OUT_DIR', 'PKG_DATA_DIR holds Rdata.rdx and Rdata.rdb of r-cran-dslabs');
    try { fs.mkdirSync(outDir, { recursive: true }); } catch (e) { fail(`cannot create ${outDir}: ${e.message}`, 'check the path'); }
    const t0 = Date.now();
    const m = readMovielens(dir);
    const got = validate(m);
    const s = frame(m, outDir);
    const pos = s.trainPos + s.testPos, n = s.train + s.test;
    const rate = pos / n;
    const pct = (a, b) => (100 * a / b).toFixed(1) + '%';
    console.log(`movielens: ${got.ratings} ratings, ${got.users} users, ${got.movies} movies, ${m.genreLevels.length} genre combinations`);
    console.log(`movielens: positive (rating >= 4): ${pos} = ${pct(pos, n)}`);
    console.log(`movielens: train ${s.train} (timestamp < ${s.cutoff} = ${new Date(s.cutoff * 1000).toISOString()}), positive ${pct(s.trainPos, s.train)}`);
    console.log(`movielens: test  ${s.test} (timestamp >= ${s.cutoff}), positive ${pct(s.testPos, s.test)}`);
    console.log(`movielens: empty histories ${s.emptyHistory}, mean history length ${(s.histSum / n).toFixed(1)} (cap ${HIST_CAP})`);
    if (Math.abs(rate - EXPECT.positiveRate) > 0.0005) fail(`positive rate ${rate.toFixed(4)}, expected ${EXPECT.positiveRate}`, 'the extracted data is not MovieLens latest-small 2016');
    console.log(`movielens: wrote ${outDir}/{ratings,clicks_train,clicks_test}.tsv in ${((Date.now() - t0) / 1000).toFixed(2)} s`);
}

// Also a module, so tests can reuse the reader: { unserialize, readIndex, fetchObject }.
if (require.main === module) main();
else module.exports = { unserialize, readIndex, fetchObject };
