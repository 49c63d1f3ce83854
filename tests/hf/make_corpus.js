// The real-text corpus of tests/hf_tokenizer_test.sh: State of the Union speeches cut after
// sentences into records of at most ~3,000 characters (the reference's BPE is slow on one
// 50 KB word, which Llama 2's tokenizer makes of a whole section), and every fourth record again
// with its sentences laid out in lines and paragraphs (\n, \n\n, \r\n, tabs, double spaces), so
// the newline and whitespace-run rules meet real text too. Records are separated by U+001E.
//   node make_corpus.js OUT FILE...
const fs = require('fs');
const [out, ...files] = process.argv.slice(2);
const recs = [];
const seps = ['.\n', '.\n\n', '.  ', '.\r\n', '. \n', '.\t', '.\n   ', '. \n\n'];
for (const f of files) {
    const text = fs.readFileSync(f, 'utf8');
    for (let i = 0; i < text.length;) {
        let j = Math.min(text.length, i + 3000);
        if (j < text.length) {
            const k = text.lastIndexOf('. ', j);
            if (k > i) j = k + 2;
        }
        recs.push(text.slice(i, j));
        i = j;
    }
}
const n = recs.length;
let k = 0;
for (let i = 0; i < n; i += 4) recs.push(recs[i].replace(/\. /g, () => seps[k++ % seps.length]));
fs.writeFileSync(out, recs.join('\x1e'));
