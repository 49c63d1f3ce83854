// Reference ids for tests/hf_tokenizer_test.sh: @lenml/tokenizers 3.7.2 (a port of
// transformers.js). Each FILE is read as UTF-8 the way node reads files (ill-formed bytes become
// U+FFFD) and holds records separated by U+001E; one line of ids per record. A FILE written
// add:FILE is encoded with the post-processor's special tokens (add_special_tokens).
//   node ref_encode.js NODE_MODULES TOKENIZER_DIR FILE|add:FILE...
const path = require('path');
const fs = require('fs');
const [modules, dir, ...files] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(modules, '@lenml/tokenizers'));
const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
});
const out = [];
for (const f of files) {
    const add = f.startsWith('add:');
    for (const rec of fs.readFileSync(add ? f.slice(4) : f, 'utf8').split('\x1e'))
        out.push(tok.encode(rec, { add_special_tokens: add }).join(' '));
}
process.stdout.write(out.join('\n') + '\n');
