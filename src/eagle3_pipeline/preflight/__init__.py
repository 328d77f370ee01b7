"""preflight"""
