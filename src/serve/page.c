/* The web chat page (serve/chat_page.html), embedded in the binary as srv_chat_page (one
 * NUL-terminated string) by the assembler's .incbin: the page stays a plain HTML file in the
 * tree. The Makefile names the HTML as this object's prerequisite. */
__asm__(".section .rodata\n"
        ".global srv_chat_page\n"
        ".type srv_chat_page, @object\n"
        ".balign 16\n"
        "srv_chat_page:\n"
        ".incbin \"src/serve/chat_page.html\"\n"
        ".byte 0\n"
        ".size srv_chat_page, . - srv_chat_page\n"
        ".previous\n");
