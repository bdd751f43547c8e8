"""TODO server"""
