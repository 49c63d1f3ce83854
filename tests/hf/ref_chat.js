// Reference for the chat part of tests/hf_tokenizer_test.sh: renders each JSON-lines example with
// the family's chat template as transformers does (for Llama 3 also checked against the
// template in tokenizer_config.json, run by @lenml/tokenizers' Jinja), encodes the whole text
// with @lenml/tokenizers and appends the end-of-text token where nobubble packs one; SHARD (from
// 'nobubble tokenize --chat') must hold those ids, and the tokens SHARD.mask marks as targets,
// decoded by the reference, must be the response texts (SentencePiece: less the one space its
// decoder strips at the start).
//   node ref_chat.js NODE_MODULES TOKENIZER_DIR llama3|chatml|qwen3|llama2 EXAMPLES.jsonl EOT_TEXT SHARD
const path = require('path');
const fs = require('fs');
const [modules, dir, tpl, file, eotText, shard] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(modules, '@lenml/tokenizers'));
const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')), tokenizerConfig: cfg });
const bos = cfg.bos_token || '', eos = cfg.eos_token || '';
const eot = tok.encode(eotText, { add_special_tokens: false });
function turns(ex) {
    if (ex.messages) return ex.messages.map(m => ({ role: m.role, content: m.content }));
    if (ex.conversations) return ex.conversations.map(m => ({
        role: { human: 'user', gpt: 'assistant' }[m.from] || m.from, content: m.value }));
    return [{ role: 'user', content: ex.input ? ex.instruction + '\n\n' + ex.input : ex.instruction },
            { role: 'assistant', content: ex.output }];
}
const strip = s => s.replace(/^[ \t\n\r\v\f]+|[ \t\n\r\v\f]+$/g, '');
function render(ms) { // [text, response text]
    let text = '', resp = '';
    if (tpl === 'llama3') {
        ms.forEach((m, i) => {
            const c = strip(m.content) + '<|eot_id|>';
            text += (i === 0 ? bos : '') + '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + c;
            if (m.role === 'assistant') resp += c;
        });
        const j = tok.apply_chat_template(ms, { tokenize: false });
        const gen = '<|start_header_id|>assistant<|end_header_id|>\n\n';
        if (j !== text + gen) { console.error('llama3 template differs:\n' + JSON.stringify(j) + '\n' + JSON.stringify(text + gen)); process.exit(1); }
    } else if (tpl === 'qwen3') {
        // Qwen3's template: the assistant turns after the last user turn keep a thinking block
        let last = ms.length - 1;
        for (let i = ms.length - 1; i >= 0; i--) if (ms[i].role === 'user') { last = i; break; }
        ms.forEach((m, i) => {
            if (m.role !== 'assistant') { text += '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n'; return; }
            let c = m.content, r = '';
            if (c.includes('</think>')) {
                r = c.split('</think>')[0].replace(/\n+$/, '').split('<think>').pop().replace(/^\n+/, '');
                c = c.split('</think>').pop().replace(/^\n+/, '');
            }
            const body = i > last && (i === ms.length - 1 || r)
                ? '<think>\n' + r.replace(/^\n+|\n+$/g, '') + '\n</think>\n\n' + c.replace(/^\n+/, '') : c;
            text += '<|im_start|>assistant\n' + body + '<|im_end|>\n';
            resp += body + '<|im_end|>';
        });
        let j = null;
        try { j = tok.apply_chat_template(ms, { tokenize: false }); } catch (e) { j = null; }
        if (j !== null && j !== text) { console.error('qwen3 template differs:\n' + JSON.stringify(j) + '\n' + JSON.stringify(text)); process.exit(1); }
        if (j === null) console.error('note: the reference\'s Jinja could not render Qwen3\'s template; checked against the transcription only');
    } else if (tpl === 'chatml') {
        for (const m of ms) {
            text += '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n';
            if (m.role === 'assistant') resp += m.content + '<|im_end|>';
        }
    } else {
        const sys = ms[0].role === 'system' ? strip(ms[0].content) : null;
        let first = true;
        for (const m of ms) {
            if (m.role === 'system') continue;
            if (m.role === 'user') {
                text += bos + '[INST] ' + (first && sys !== null ? '<<SYS>>\n' + sys + '\n<</SYS>>\n\n' : '') + strip(m.content) + ' [/INST]';
                first = false;
            } else {
                text += ' ' + strip(m.content) + ' ' + eos;
                resp += ' ' + strip(m.content) + ' ' + eos;
            }
        }
    }
    return [text, resp];
}
let ids = [], resp = '';
for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const [text, r] = render(turns(JSON.parse(line)));
    const e = tok.encode(text, { add_special_tokens: false });
    ids.push(...e);
    if (e[e.length - 1] !== eot[0]) ids.push(...eot);
    resp += r;
}
const b = fs.readFileSync(shard), mk = fs.readFileSync(shard + '.mask');
const n = b.readInt32LE(8), w = b.readInt32LE(0) === 20240801 ? 4 : 2;
const got = [], targets = [];
for (let i = 0; i < n; i++) got.push(w === 4 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
if (got.join(' ') !== ids.join(' ')) {
    let k = 0; while (got[k] === ids[k]) k++;
    console.log(`ids differ from the reference's encoding of the rendered text at token ${k}: ours ${got.slice(k, k + 8).join(' ')}, reference ${ids.slice(k, k + 8).join(' ')}`);
    process.exit(1);
}
if (mk.readInt32LE(0) !== 20261205 || mk.readInt32LE(4) !== 1 || mk.readInt32LE(8) !== n || mk.length !== 1024 + n) {
    console.log(`mask header or size wrong: magic ${mk.readInt32LE(0)} version ${mk.readInt32LE(4)} count ${mk.readInt32LE(8)} of ${n}, ${mk.length} bytes`);
    process.exit(1);
}
for (let i = 0; i < n; i++) if (mk[1024 + i]) targets.push(got[i]);
const text = tok.decode(targets, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
if (tpl === 'llama2') resp = resp.replace(/^ /, '');
if (text !== resp) { console.log(`targets decode to ${JSON.stringify(text)}\nwant ${JSON.stringify(resp)}`); process.exit(1); }
console.log(`the reference's ids of the rendered text (${n} tokens); the ${targets.length} targets are the responses`);
