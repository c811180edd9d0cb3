"""Chat-ops: Slack, Feishu/Lark and DingTalk bots; formatting is shared, each platform is one transport file."""

from __future__ import annotations


def routers() -> list:
    from api.chatops import dingtalk, feishu, slack

    return [slack.router, feishu.router, dingtalk.router]
