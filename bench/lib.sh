# Shared by the bench scripts (sourced): where the real ChatGLM-6B tokenizer is.
# find_tokenizer NAME: sets TOKENIZER to the first folder holding ice_text.model among $TOKENIZER,
# ../shared/tokenizers/chatglm-6b and build/shared/tokenizers/chatglm-6b (what the GPU runs carry),
# or exits naming the script.
find_tokenizer() {
    local t
    for t in "${TOKENIZER:-}" ../shared/tokenizers/chatglm-6b build/shared/tokenizers/chatglm-6b; do
        if [ -n "$t" ] && [ -f "$t/ice_text.model" ]; then TOKENIZER=$t; return 0; fi
    done
    echo "$1: no ChatGLM-6B tokenizer (set TOKENIZER)"
    exit 1
}
