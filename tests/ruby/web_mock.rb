# Sidekiq's Web UI as a bare Rack app, for the scripts that render its
# pages: Sidekiq::Web wants a session (its CSRF check and its locale are
# kept there). Returns a Rack::MockRequest on it.
require 'sidekiq/web'
require 'rack/mock'
require 'rack/session/cookie'

def sidekiq_web
  app = Rack::Builder.new do
    use Rack::Session::Cookie, secret: 'x' * 64, same_site: true
    run Sidekiq::Web.new
  end
  Rack::MockRequest.new(app)
end
