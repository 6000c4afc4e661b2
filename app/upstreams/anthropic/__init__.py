"""Anthropic's Messages API as an upstream, and the relaying of answers translated to or
from it. The translation itself is pure and lives in `app.anthropic`:

    provider       AnthropicProvider: a cloud provider speaking Messages (OpenAI requests
                   translated there, its answers and streams translated back)
    inbound_relay  as_messages / as_token_count: an opened chat-completions (or /tokenize)
                   answer of a local backend relayed as a Messages one
    relayed        TranslatedStream: the loop both streams share
    bodies         the bodies and content types they relay; whole_answer: an answer read
                   whole and translated, for both directions
"""
