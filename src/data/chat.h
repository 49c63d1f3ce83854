/* Instruction and chat examples (one JSON object per line) rendered with a model family's chat
 * template into text segments, each marked prompt or response, for 'nobubble tokenize --chat'.
 *
 * Example layouts, detected per line by their fields:
 *   alpaca    {"instruction": ..., "input": ... (optional), "output": ...}
 *   sharegpt  {"conversations": [{"from": "system"|"human"|"user"|"gpt"|"assistant", "value": ...}]}
 *   messages  {"messages": [{"role": "system"|"user"|"assistant", "content": ...}]} (OpenAI)
 * Templates (the texts transformers' chat templates of these families make for a conversation,
 * without a generation prompt):
 *   llama3  bos <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT(trimmed)<|eot_id|> ...
 *   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n ...   (Qwen2/2.5)
 *   qwen3   chatml, and the assistant turns after the last user turn as Qwen3's template writes
 *           them: the last one always with its thinking block, empty or not
 *           (<think>\nREASONING\n</think>\n\nCONTENT), the others with one only when their content
 *           holds one (<think>...</think> in the content; before the last user turn it is dropped)
 *   llama2  <s>[INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ASSISTANT </s><s>[INST] ...
 *   plain   CONTENT\n\n for system and user turns, CONTENT eos for the assistant's
 * A response segment is an assistant's content and the token that ends its turn (<|eot_id|>,
 * <|im_end|>, </s>, eos), so a model trained on responses learns to stop. */
#ifndef NB_CHAT_H
#define NB_CHAT_H

#include <stddef.h>

#include "io/json.h"

typedef enum { NB_CHAT_PLAIN, NB_CHAT_LLAMA3, NB_CHAT_CHATML, NB_CHAT_LLAMA2, NB_CHAT_QWEN3, NB_CHAT_COUNT } nb_chat_template;

/* "plain", "llama3", "chatml", "llama2", "qwen3" -> template; -1 for anything else. */
int nb_chat_template_parse(const char *name);
const char *nb_chat_template_name(nb_chat_template t);

typedef struct {
    char *text; /* malloc'd, NUL-terminated */
    size_t len;
    int response;
} nb_chat_seg;

typedef struct {
    nb_chat_seg *seg;
    int n, cap;
} nb_chat_out;

/* Render one example. bos/eos: the tokenizer's texts of those tokens ("" when it has none).
 * Returns 0, or -1 with a message naming the field in err ("messages[2].content: missing"). */
int nb_chat_render(nb_chat_template tpl, const nb_json *example, const char *bos, const char *eos, nb_chat_out *out,
                   char *err, size_t errcap);
void nb_chat_out_clear(nb_chat_out *out);
void nb_chat_out_free(nb_chat_out *out);

#endif
